// Sparsifiers: TopK-Chunked (all-reduce) and classic TopK (all-gather).
#pragma once

#include <gradcomp/compressors/topk/topk.hpp>
#include <gradcomp/compressors/topk/topk_chunked.hpp>
