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
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::python {

namespace py = pybind11;

/// Adds gradcomp's classes and functions to `m`; its DDP hook states reduce
/// device buckets where `device` is given (see ddp_hook_device.cuh).
inline void define(py::module_& m, ddp_hook_device const* device = nullptr) {
  m.attr("__version__") = GRADCOMP_VERSION_STRING;
  m.attr("device_buckets") = device != nullptr;
  m.def(
      "compressors",
      [] {
        std::vector<std::string> out;
        for_each_registered([&]<class C>(std::type_identity<C>) { out.emplace_back(C::name); });
        return out;
      },
      "The registered compressors' names, as a spec names them.");
  m.def(
      "shards",
      [](std::string const& text) {
        return detail::spec_failure(compressor_spec::parse(text), 2, detail::refuse_unshardable).empty();
      },
      py::arg("spec"), "Whether the compressor a spec names can reduce-scatter (FSDP: gradcomp.torch.ReduceScatter).");
  m.def(
      "parse_spec",
      [](std::string const& text) {
        if (!is_auto_spec(text)) return compressor_spec::parse(text).str();
        std::string out = "auto:of=";
        for (auto const& c : auto_candidates(text)) out += (out.back() == '=' ? "" : "+") + c.str();
        return out;
      },
      py::arg("spec"),
      "Checks a compressor spec (or 'auto:of=A+B', the planner's choice among A and B) and returns it in its "
      "canonical form; raises ValueError naming what is wrong.");

  // The base first: pybind11 tries the translators last registered first.
  py::register_exception<error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<invalid_argument>(m, "InvalidArgument", PyExc_ValueError);
  py::register_exception<collective_error>(m, "CollectiveError", PyExc_RuntimeError);
  py::register_exception<nonfinite_error>(m, "NonfiniteError", PyExc_ArithmeticError);

  py::class_<ddp_hook_state>(m, "HookState", "Every DDP bucket's gradcomp reduction (see gradcomp.torch.register).")
      .def(py::init([device](c10::intrusive_ptr<c10d::ProcessGroup> group, std::string const& compressor,
                             std::string const& small, std::size_t min_compression_elements, std::uint64_t warmup,
                             std::optional<std::uint64_t> seed, std::string const& nonfinite, int threads) {
             ddp_hook_options o;
             if (is_auto_spec(compressor)) {
               o.candidates = auto_candidates(compressor);
               o.compressor = o.candidates.front();
             } else {
               o.compressor = compressor_spec::parse(compressor);
             }
             o.small = compressor_spec::parse(small);
             o.min_compression_elements = min_compression_elements;
             o.warmup_iterations = warmup;
             o.reduce.seed = seed;
             o.threads = threads;
             GRADCOMP_EXPECTS(nonfinite == "raise" || nonfinite == "propagate",
                              "nonfinite must be 'raise' or 'propagate', not '" + nonfinite + "'");
             o.reduce.nonfinite = nonfinite == "raise" ? nonfinite_policy::raise : nonfinite_policy::propagate;
             return std::make_unique<ddp_hook_state>(std::move(group), std::move(o), device);
           }),
           py::arg("group"), py::arg("compressor"), py::arg("small"), py::arg("min_compression_elements"),
           py::arg("warmup"), py::arg("seed"), py::arg("nonfinite"), py::arg("threads"))
      .def(
          "reduce",
          [](ddp_hook_state& s, std::size_t index, at::Tensor const& buffer, ddp_hook_state::shapes const& params) {
            py::gil_scoped_release release;
            s.reduce(index, buffer, params);
          },
          py::arg("index"), py::arg("buffer"), py::arg("shapes"),
          "Reduces DDP bucket `index` in place to the mean over the ranks (collective; releases the GIL).")
      .def("end_iteration", &ddp_hook_state::end_iteration)
      .def_property_readonly("iterations", &ddp_hook_state::iterations)
      .def_property_readonly("wire_bytes", &ddp_hook_state::wire_bytes)
      .def("description", &ddp_hook_state::description, py::arg("index"))
      .def("choices", &ddp_hook_state::choices, "The planner's choice of each bucket it planned, by index.")
      .def("save",
           [](ddp_hook_state& s) {
             std::map<std::size_t, std::vector<std::byte>> buckets;
             std::uint64_t iterations = 0;
             {
               py::gil_scoped_release release;
               std::tie(iterations, buckets) = s.save();
             }
             py::dict out;
             for (auto const& [index, bytes] : buckets)
               out[py::int_(index)] = py::bytes(reinterpret_cast<char const*>(bytes.data()), bytes.size());
             return py::make_tuple(iterations, out);
           })
      .def(
          "load",
          [](ddp_hook_state& s, std::uint64_t iterations, py::dict const& buckets,
             std::map<std::size_t, std::string> const& choices) {
            std::map<std::size_t, std::vector<std::byte>> in;
            for (auto const& [key, value] : buckets) {
              std::string const bytes = py::cast<std::string>(value);
              auto const* first = reinterpret_cast<std::byte const*>(bytes.data());
              in.emplace(py::cast<std::size_t>(key), std::vector<std::byte>(first, first + bytes.size()));
            }
            s.load(iterations, std::move(in), choices);
          },
          py::arg("iterations"), py::arg("buckets"), py::arg("choices"));

  m.def(
      "lane_group",
      [](c10::intrusive_ptr<c10d::ProcessGroup> const& group) {
        py::gil_scoped_release release;
        c10::intrusive_ptr<c10d::ProcessGroup> lane = c10d_communicator(group).split(0, group->getRank()).group();
        return lane;
      },
      py::arg("group"),
      "A group of the same ranks as `group`, split from its host backend (its timeout too): one more lane of the "
      "DDP hook's host buckets. Collective over `group`.");

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
