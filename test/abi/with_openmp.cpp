// Compiled with OpenMP: calls a function the other translation unit defines.
#include "shared.hpp"

int main() { return threads_of(gradcomp::host_space{}) > 0 ? 0 : 1; }
