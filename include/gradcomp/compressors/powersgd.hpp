// PowerSGD low-rank compression.
#pragma once

#include <gradcomp/compressors/powersgd/powersgd.hpp>
