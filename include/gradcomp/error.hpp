// Exceptions and the precondition / CUDA-call check macros.
#pragma once

#include <gradcomp/config.hpp>

#include <stdexcept>
#include <string>

namespace gradcomp::inline GRADCOMP_ABI {

/// Base of every exception gradcomp throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller broke a precondition: wrong sizes, an unsupported parameter,
/// ranks that disagree on configuration.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A gradient held NaN or infinity, or a value too large for the wire lane,
/// on some rank. Thrown on every rank together (on the CUDA space at the next
/// call or synchronize()); the gradient and every piece of state are left as
/// they were before that step.
class nonfinite_error : public error {
 public:
  using error::error;
};

/// A collective failed or was aborted (a peer rank failed, NCCL reported an
/// asynchronous error). The communicator must not be used again.
class collective_error : public error {
 public:
  using error::error;
};

/// A CUDA runtime call failed.
class cuda_error : public error {
 public:
  using error::error;
};

}  // namespace gradcomp

/// Throws gradcomp::invalid_argument with `message` (anything convertible to
/// std::string) when `condition` is false. The message is only built then.
#define GRADCOMP_EXPECTS(condition, message)                                    \
  do {                                                                          \
    if (!(condition)) throw ::gradcomp::invalid_argument(std::string(message)); \
  } while (0)
