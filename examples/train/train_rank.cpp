// train_rank over any_collective, compiled once: trainer.hpp declares it
// extern for the trainer and its tests, whatever their backend.
#include "trainer.hpp"

template train::result train::train_rank(gradcomp::any_collective&, train::options const&, train::dataset const&,
                                         train::dataset const&, train::reducer_factory);
