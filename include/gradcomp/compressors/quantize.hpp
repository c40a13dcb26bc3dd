// The integer all-reduce quantizers: QSGD-MaxNorm (single and multi-scale),
// GlobalRandK-MaxNorm and IntSGD.
#pragma once

#include <gradcomp/compressors/quantize/intsgd.hpp>
#include <gradcomp/compressors/quantize/qsgd.hpp>
