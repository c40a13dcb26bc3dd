// gradcomp's Python bindings (the module gradcomp.torch._C): what the
// package gradcomp.torch builds its DDP hook on. A team with a Python
// extension of its own can add the same classes to it with define().
//
// Needs PyTorch's headers and pybind11 (PyTorch's own copy); without them
// this header compiles to nothing.
#pragma once

#include <gradcomp/planning/planner.hpp>
#include <gradcomp/torch/ddp_hook.hpp>
#include <gradcomp/torch/fsdp_reduce_scatter.hpp>

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>) && __has_include(<torch/csrc/utils/pybind.h>)

#include <gradcomp/version.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::python {

namespace py = pybind11;

namespace detail {

// gradcomp's Python exception types, as define() registered them (the
// module holds them, so plain handles do).
struct exception_types {
  py::handle error, invalid_argument, collective_error, nonfinite_error;
};
inline exception_types& registered_exception_types() {
  static exception_types types;
  return types;
}

// A step's error as the Python exception of its gradcomp type, wrapped as
// torch's python_error: DDP's wait and autograd rethrow that as the Python
// exception itself, so `except gradcomp.torch.NonfiniteError` around
// backward() catches it, with gradcomp's message alone. Other errors pass as
// they are. Runs on a lane's thread: takes the GIL.
inline std::exception_ptr as_python_error(std::exception_ptr error) {
  exception_types const& types = registered_exception_types();
  py::gil_scoped_acquire gil;
  try {
    std::rethrow_exception(error);
  } catch (nonfinite_error const& e) {
    PyErr_SetString(types.nonfinite_error.ptr(), e.what());
  } catch (collective_error const& e) {
    PyErr_SetString(types.collective_error.ptr(), e.what());
  } catch (invalid_argument const& e) {
    PyErr_SetString(types.invalid_argument.ptr(), e.what());
  } catch (gradcomp::error const& e) {
    PyErr_SetString(types.error.ptr(), e.what());
  } catch (...) {
    return error;
  }
  python_error raised;
  raised.persist();
  return std::make_exception_ptr(std::move(raised));
}

inline py::bytes to_bytes(std::vector<std::byte> const& b) {
  return {reinterpret_cast<char const*>(b.data()), b.size()};
}
inline std::vector<std::byte> from_bytes(py::bytes const& b) {
  std::string const s = b;
  auto const* first = reinterpret_cast<std::byte const*>(s.data());
  return {first, first + s.size()};
}

// The hook's options, each once: its Python name, its meaning, and how it
// reads and writes the C++ field (the defaults are the C++ struct's).
inline void define_options(py::module_& m) {
  using o = ddp_hook_options;
  py::class_<o> c(m, "Options",
                  "How gradcomp's DDP hook reduces DDP's buckets; every field's default is the hook's (see "
                  "gradcomp.torch.register).");
  c.def(py::init<>());
  c.def_property(
      "compressor", [](o const& x) { return x.compressor.str(); },
      [](o& x, std::string const& v) { x.compressor = compressor_choice::parse(v); },
      "The compressor of buckets that take one (a matrix and min_compression_elements values): a spec, or "
      "'auto' / 'auto:of=A+B' for the planner's choice per bucket.");
  c.def_property(
      "small", [](o const& x) { return x.small.str(); },
      [](o& x, std::string const& v) { x.small = compressor_spec::parse(v); },
      "The compressor of the buckets that do not take `compressor`: those of fewer than min_compression_elements "
      "values and (vectors_uncompressed) those of 1-D tensors only.");
  c.def_readwrite("min_compression_elements", &o::min_compression_elements,
                  "Buckets of fewer values than this (an element count, not a ratio) take `small`.");
  c.def_readwrite("vectors_uncompressed", &o::vectors_uncompressed,
                  "Buckets of 1-D tensors only (biases, norms) take `small`.");
  c.def_property(
      "warmup", [](o const& x) { return x.reduce.warmup_steps; },
      [](o& x, std::uint64_t v) { x.reduce.warmup_steps = v; },
      "Iterations that send the plain fp32 mean before the compressors start (PyTorch's start_powerSGD_iter). "
      "DDP rebuilds its buckets after the first iteration; with two or more, the compressors start on the rebuilt "
      "buckets, and stateful ones (error feedback, PowerSGD's warm start) keep no state of buckets DDP dropped.");
  c.def_property(
      "seed", [](o const& x) { return x.reduce.seed; }, [](o& x, std::optional<std::uint64_t> v) { x.reduce.seed = v; },
      "Seeds every bucket's random streams (None: each bucket's own, from its layout and index).");
  c.def_property(
      "nonfinite",
      [](o const& x) { return std::string(x.reduce.nonfinite == nonfinite_policy::raise ? "raise" : "propagate"); },
      [](o& x, std::string const& v) {
        GRADCOMP_EXPECTS(v == "raise" || v == "propagate", "nonfinite must be 'raise' or 'propagate', not '" + v + "'");
        x.reduce.nonfinite = v == "raise" ? nonfinite_policy::raise : nonfinite_policy::propagate;
      },
      "What a NaN or infinity does: 'raise' (every rank raises NonfiniteError) or 'propagate' (the bucket is NaN "
      "on every rank). CUDA buckets always propagate: raising would need the host to wait.");
  c.def_property(
      "lanes", [](o const& x) { return x.lanes; },
      [](o& x, int v) {
        GRADCOMP_EXPECTS(v >= 1, "lanes must be 1 or more, not " + std::to_string(v));
        x.lanes = v;
      },
      "Host buckets reduced at once, each lane on a thread and a group of its own split from the process group; "
      "the results are the same for any number.");
  c.def_readwrite("threads", &o::threads, "Threads of the host loops (0: OpenMP's default).");
  c.def_readwrite("auto_steps_factor", &o::auto_steps_factor,
                  "'auto': steps to a target relative to bf16's, by candidate spec ({'topkc': 1.3}), where measured "
                  "for this model; the planner then ranks by predicted time to target.");
  c.def_readwrite("auto_unknown_steps_factor", &o::auto_unknown_steps_factor,
                  "'auto': the steps factor of a candidate auto_steps_factor leaves out (2: a compressor is chosen "
                  "only where it would pay even at twice bf16's steps; 1: by step time alone).");
  c.def("__repr__", [](o const& x) {
    return "Options(compressor='" + x.compressor.str() + "', small='" + x.small.str() +
           "', min_compression_elements=" + std::to_string(x.min_compression_elements) +
           ", warmup=" + std::to_string(x.reduce.warmup_steps) + ", lanes=" + std::to_string(x.lanes) + ")";
  });
  c.def(py::pickle(
      [](o const& x) {
        return py::make_tuple(x.compressor.str(), x.small.str(), x.min_compression_elements, x.vectors_uncompressed,
                              x.reduce.warmup_steps, x.reduce.seed, static_cast<int>(x.reduce.nonfinite), x.lanes,
                              x.threads, x.auto_steps_factor, x.auto_unknown_steps_factor);
      },
      [](py::tuple const& t) {
        o x;
        x.compressor = compressor_choice::parse(t[0].cast<std::string>());
        x.small = compressor_spec::parse(t[1].cast<std::string>());
        x.min_compression_elements = t[2].cast<std::size_t>();
        x.vectors_uncompressed = t[3].cast<bool>();
        x.reduce.warmup_steps = t[4].cast<std::uint64_t>();
        x.reduce.seed = t[5].cast<std::optional<std::uint64_t>>();
        x.reduce.nonfinite = static_cast<nonfinite_policy>(t[6].cast<int>());
        x.lanes = t[7].cast<int>();
        x.threads = t[8].cast<int>();
        x.auto_steps_factor = t[9].cast<std::map<std::string, double>>();
        x.auto_unknown_steps_factor = t[10].cast<double>();
        return x;
      }));
}

}  // namespace detail

/// Adds gradcomp's classes and functions to `m`; its DDP hook states reduce
/// device buckets where `device` is given (see ddp_hook_device.cuh).
inline void define(py::module_& m, ddp_hook_device const* device = nullptr) {
  m.attr("__version__") = GRADCOMP_VERSION_STRING;
  m.attr("device_buckets") = device != nullptr;
  m.def(
      "compressors",
      [] {
        py::dict out;  // (in the registry's order)
        for_each_registered([&]<class C>(std::type_identity<C>) {
          py::dict keys;
          for_each_parameter<C>([&](auto const& p) {
            keys[py::str(std::string(p.key))] = std::string(p.meaning) + " (" + std::string(p.range) + ")";
          });
          if (C::integer_lane)
            keys["lane"] = "the integer lane (auto: the narrowest n ranks cannot overflow, int8, int32)";
          keys["ef"] =
              std::string("error feedback (on, off; ") + (C::error_feedback_by_default ? "on" : "off") + " by default)";
          out[py::str(std::string(C::name))] = keys;
        });
        return out;
      },
      "The registered compressors by the name a spec gives them, each with the keys its spec takes and what each "
      "means.");
  m.def(
      "shards",
      [](std::string const& text) {
        return gradcomp::detail::spec_failure(compressor_spec::parse(text), 2, gradcomp::detail::refuse_unshardable)
            .empty();
      },
      py::arg("spec"), "Whether the compressor a spec names can reduce-scatter (FSDP: gradcomp.torch.ReduceScatter).");
  m.def(
      "parse_spec", [](std::string const& text) { return compressor_choice::parse(text).str(); }, py::arg("spec"),
      "Checks a compressor spec (or 'auto:of=A+B', the planner's choice among A and B) and returns it in its "
      "canonical form; raises ValueError naming what is wrong.");

  // The base first: pybind11 tries the translators last registered first.
  // Each also derives from Error, so `except Error` catches every one, and
  // from the builtin a Python user would try first.
  detail::exception_types& types = detail::registered_exception_types();
  types.error = py::register_exception<error>(m, "Error", PyExc_RuntimeError);
  auto with_error = [&](PyObject* builtin) { return py::make_tuple(types.error, py::handle(builtin)); };
  types.invalid_argument = py::register_exception<invalid_argument>(m, "InvalidArgument", with_error(PyExc_ValueError));
  types.collective_error = py::register_exception<collective_error>(m, "CollectiveError", types.error);
  types.nonfinite_error =
      py::register_exception<nonfinite_error>(m, "NonfiniteError", with_error(PyExc_ArithmeticError));

  detail::define_options(m);

  py::class_<ddp_hook_state>(m, "HookState", "Every DDP bucket's gradcomp reduction (see gradcomp.torch.register).")
      .def(py::init([device](c10::intrusive_ptr<c10d::ProcessGroup> group, ddp_hook_options const& options) {
             auto state = std::make_unique<ddp_hook_state>(std::move(group), options, device);
             state->set_error_translator(&detail::as_python_error);
             return state;
           }),
           py::arg("group"), py::arg("options"))
      .def(
          "reduce",
          [](ddp_hook_state& s, std::size_t index, at::Tensor const& buffer, std::vector<std::size_t> const& positions,
             ddp_hook_state::shapes const& params, bool last) {
            // A Python hook's future holds a Python object (DDP's PythonCommHook
            // reads it so): the buffer, wrapped here, where the GIL is held.
            c10::IValue value = torch::jit::toIValue(py::cast(buffer), c10::PyObjectType::get());
            c10::intrusive_ptr<c10::ivalue::Future> future;
            {
              py::gil_scoped_release release;
              future = s.reduce(index, buffer, positions, params, last, std::move(value));
            }
            return torch::jit::toPyObject(c10::IValue(std::move(future)));
          },
          py::arg("index"), py::arg("buffer"), py::arg("positions"), py::arg("shapes"), py::arg("last"),
          "Reduces DDP bucket `index` in place to the mean over the ranks; returns the torch.futures.Future DDP "
          "waits on (collective).")
      .def_property_readonly(
          "options", [](ddp_hook_state const& s) { return s.options(); }, "A copy of its options.")
      .def_property_readonly("iterations", &ddp_hook_state::iterations)
      .def_property_readonly("lanes", &ddp_hook_state::lanes,
                             "The lanes host buckets are reduced on (0 before the first host bucket).")
      .def_property_readonly("wire_bytes",
                             [](ddp_hook_state& s) {
                               py::gil_scoped_release release;
                               return s.wire_bytes();
                             })
      .def(
          "description",
          [](ddp_hook_state& s, std::size_t index) {
            py::gil_scoped_release release;
            return s.description(index);
          },
          py::arg("index"))
      .def(
          "choices",
          [](ddp_hook_state& s) {
            py::gil_scoped_release release;
            return s.choices();
          },
          "The planner's choice of each bucket it planned, by index.")
      .def(
          "report",
          [](ddp_hook_state& s) {
            py::gil_scoped_release release;
            return s.report();
          },
          "What the planner weighed for each bucket it planned, in index order (this rank's timings).")
      .def("save",
           [](ddp_hook_state& s) {
             std::map<std::string, std::vector<std::byte>> saved;
             {
               py::gil_scoped_release release;
               saved = s.save();
             }
             py::dict out;
             for (auto const& [key, bytes] : saved) out[py::str(key)] = detail::to_bytes(bytes);
             return out;
           })
      .def(
          "load",
          [](ddp_hook_state& s, std::uint64_t iterations, std::map<std::string, py::bytes> const& envelopes) {
            std::map<std::string, std::vector<std::byte>> in;
            for (auto const& [key, bytes] : envelopes) in.emplace(key, detail::from_bytes(bytes));
            py::gil_scoped_release release;
            s.load(iterations, std::move(in));
          },
          py::arg("iterations"), py::arg("envelopes"));

  py::class_<fsdp_reduce_scatter>(m, "ReduceScatterState",
                                  "One FSDP module's gradcomp reduce-scatter (see gradcomp.torch.ReduceScatter).")
      .def(py::init([](c10::intrusive_ptr<c10d::ProcessGroup> group, std::string const& compressor,
                       std::optional<std::uint64_t> seed, int threads) {
             allreducer_options o;
             o.seed = seed;
             return std::make_unique<fsdp_reduce_scatter>(std::move(group), compressor_spec::parse(compressor), o,
                                                          threads);
           }),
           py::arg("group"), py::arg("compressor"), py::arg("seed"), py::arg("threads"))
      .def(
          "__call__",
          [](fsdp_reduce_scatter& s, at::Tensor const& input, at::Tensor const& output) {
            py::gil_scoped_release release;
            s(input, output);
          },
          py::arg("input"), py::arg("output"),
          "output = the mean over the ranks of this rank's block of input (collective; releases the GIL).")
      .def_property_readonly("wire_bytes", &fsdp_reduce_scatter::wire_bytes)
      .def_property_readonly("padded_block", &fsdp_reduce_scatter::padded_block);
}

}  // namespace gradcomp::inline GRADCOMP_ABI::python

#endif
