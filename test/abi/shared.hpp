// A function of a gradcomp type, declared alike in two translation units
// that were compiled differently (OpenMP on in one, off in the other).
#pragma once

#include <gradcomp/execution.hpp>

int threads_of(gradcomp::host_space const& space);
