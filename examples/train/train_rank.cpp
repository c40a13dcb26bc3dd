// train_rank over in-process ranks (threads), compiled once: trainer.hpp
// declares it extern for the trainer and its tests.
#include "trainer.hpp"

template train::result train::train_rank(gradcomp::local_group::communicator&, train::options const&,
                                         train::dataset const&, train::dataset const&, train::reducer_factory);
