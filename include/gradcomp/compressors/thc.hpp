// THC: randomized Hadamard rotation, saturation, integer all-reduce.
#pragma once

#include <gradcomp/compressors/thc/thc.hpp>
