#!/usr/bin/env bash
# Doxygen's input filter: what Doxygen 1.9 cannot parse, written as it can.
# It reads a trailing requires-clause of a member defined in its class
# (`shard(std::size_t b) requires Delivery::scatters {`) as a member without
# a name, so the clause is dropped here (the reference lists the member
# without its constraint; the header is unchanged).
exec sed -E 's/\) requires [A-Za-z_:]+ \{/) {/' "$1"
