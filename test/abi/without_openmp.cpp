// Compiled without OpenMP: its host_space is another type, so the call from
// the OpenMP translation unit finds no definition and the link fails.
#include "shared.hpp"

int threads_of(gradcomp::host_space const& space) { return space.threads_for(1 << 20); }
