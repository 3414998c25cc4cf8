// Python bindings for rwcore._evidence. Only PYBIND11_MODULE lives here; the
// public, validated Python surface is rwcore.arise.evidence and rwcore.arise.sampler.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "evidence_store.h"
#include "sampler_core.h"

namespace py = pybind11;
using rwcore::Evidence;
using rwcore::EvidenceStore;
using rwcore::SamplerCore;

template <typename T>
using Array = py::array_t<T, py::array::c_style>;

namespace {

template <typename T>
const T* data_1d(const Array<T>& array, const char* name, py::ssize_t expected) {
  if (array.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be 1-D");
  if (expected >= 0 && array.shape(0) != expected)
    throw std::invalid_argument(std::string(name) + " has length " + std::to_string(array.shape(0)) +
                                ", expected " + std::to_string(expected));
  return array.data();
}

py::tuple as_tuple(const Evidence& e) { return py::make_tuple(e.success, e.failure); }

}  // namespace

PYBIND11_MODULE(_evidence, m) {
  m.doc() = "C++ core of rwcore's evidence store and capability sampler (use rwcore.EvidenceStore and "
            "rwcore.CapabilitySampler, which validate input and map string ids).";

  py::class_<EvidenceStore>(m, "EvidenceStore")
      .def(py::init<double, double>(), py::arg("gamma_obs"), py::arg("gamma_unobs"),
           "Empty store with decay factors gamma_obs (per observed version step) and gamma_unobs "
           "(per unobserved version), each in (0, 1].")
      .def("observe", &EvidenceStore::observe, py::arg("tag"), py::arg("rubric"), py::arg("success"),
           py::arg("failure"), py::arg("version"),
           "Adds one observation (success, failure) made by policy `version` to cell (tag, rubric) "
           "with Arise eq. 20's two-scale decay.")
      .def(
          "observe_many",
          [](EvidenceStore& self, const Array<int64_t>& tags, const Array<int64_t>& rubrics,
             const Array<double>& successes, const Array<double>& failures,
             const Array<int64_t>& versions) {
            const py::ssize_t n = tags.ndim() == 1 ? tags.shape(0) : -1;
            const int64_t* t = data_1d(tags, "tags", -1);
            const int64_t* r = data_1d(rubrics, "rubrics", n);
            const double* s = data_1d(successes, "successes", n);
            const double* f = data_1d(failures, "failures", n);
            const int64_t* v = data_1d(versions, "versions", n);
            py::gil_scoped_release release;
            self.observe_many(t, r, s, f, v, static_cast<size_t>(n));
          },
          py::arg("tags"), py::arg("rubrics"), py::arg("successes"), py::arg("failures"),
          py::arg("versions"),
          "observe() for every index in order, over int64/float64 1-D arrays of one length; the whole "
          "call is validated before anything is applied, and runs without the GIL.")
      .def(
          "query",
          [](const EvidenceStore& self, int64_t tag, int64_t rubric, int64_t version) {
            return as_tuple(self.query(tag, rubric, version));
          },
          py::arg("tag"), py::arg("rubric"), py::arg("version"),
          "(S, F) of cell (tag, rubric) as seen at policy `version`; (0, 0) for an unseen cell.")
      .def(
          "query_sum",
          [](const EvidenceStore& self, int64_t tag, const Array<int64_t>& rubrics, int64_t version) {
            const int64_t* r = data_1d(rubrics, "rubrics", -1);
            return as_tuple(self.query_sum(tag, r, static_cast<size_t>(rubrics.shape(0)), version));
          },
          py::arg("tag"), py::arg("rubrics"), py::arg("version"),
          "Sum of query(tag, r, version) over the rubrics r.")
      .def(
          "query_many",
          [](const EvidenceStore& self, const Array<int64_t>& tags, const Array<int64_t>& rubrics,
             int64_t version) {
            const py::ssize_t n = tags.ndim() == 1 ? tags.shape(0) : -1;
            const int64_t* t = data_1d(tags, "tags", -1);
            const int64_t* r = data_1d(rubrics, "rubrics", n);
            Array<double> successes(n), failures(n);
            double* s = successes.mutable_data();
            double* f = failures.mutable_data();
            {
              py::gil_scoped_release release;
              self.query_many(t, r, static_cast<size_t>(n), version, s, f);
            }
            return py::make_tuple(successes, failures);
          },
          py::arg("tags"), py::arg("rubrics"), py::arg("version"),
          "Element-wise query over int64 1-D arrays; returns two float64 arrays.")
      .def("remove_rubric", &EvidenceStore::remove_rubric, py::arg("rubric"),
           "Deletes every cell of `rubric`; returns how many were removed.")
      .def("__len__", &EvidenceStore::size, "Number of (tag, rubric) cells.")
      .def(
          "cells",
          [](const EvidenceStore& self) {
            py::list out;
            for (const auto& [ids, cell] : self.cells())
              out.append(py::make_tuple(ids.first, ids.second, cell.success, cell.failure, cell.version));
            return out;
          },
          "All cells as (tag, rubric, S, F, last_version) tuples sorted by (tag, rubric), undecayed.")
      .def_property_readonly("gamma_obs", &EvidenceStore::gamma_obs, "Decay per observed version step.")
      .def_property_readonly("gamma_unobs", &EvidenceStore::gamma_unobs, "Decay per unobserved version.")
      .def(
          "serialize", [](const EvidenceStore& self) { return py::bytes(self.serialize()); },
          "Versioned, checksummed snapshot bytes.")
      .def_static(
          "deserialize",
          [](const py::bytes& data, const std::string& what) {
            return EvidenceStore::deserialize(std::string(data), what);
          },
          py::arg("data"), py::arg("what"),
          "Store from serialize() bytes; ValueError mentioning `what` if they are corrupted or truncated.");

  py::class_<SamplerCore>(m, "SamplerCore")
      .def(py::init<const std::vector<std::vector<int32_t>>&, int32_t, int32_t, int32_t, int32_t, double,
                    double, double, double, uint64_t>(),
           py::arg("task_tags"), py::arg("num_tags"), py::arg("num_capabilities"), py::arg("batch_size"),
           py::arg("group_size"), py::arg("rho_min"), py::arg("quota_fraction"), py::arg("gamma_obs"),
           py::arg("gamma_unobs"), py::arg("seed"),
           "Sampler over dense ids: task_tags[x] lists the tag indices of task x.")
      .def("set_rubrics", &SamplerCore::set_rubrics, py::arg("slot_capability"), py::arg("reset_slots"),
           "Replaces the pool: slot_capability[s] is slot s's capability index or -1; changed slots and "
           "reset_slots lose their evidence and records.")
      .def(
          "record_group",
          [](SamplerCore& self, int32_t task, std::vector<int32_t> slots, const Array<uint8_t>& codes,
             int64_t version) {
            std::vector<uint8_t> flat(codes.data(), codes.data() + codes.size());
            self.record_group(task, slots, flat, version);
          },
          py::arg("task"), py::arg("slots"), py::arg("codes"), py::arg("version"),
          "One rollout group: codes [len(slots), group_size] uint8 (0 fail, 1 pass, 2 n/a, 3 invalid).")
      .def("sample", &SamplerCore::sample, py::arg("version"), "One batch of distinct task indices.")
      .def("coverage", &SamplerCore::coverage, "Arise eq. 11 coverage C.")
      .def(
          "pair_evidence",
          [](const SamplerCore& self, int32_t tag, int32_t capability, int64_t version) {
            return as_tuple(self.pair_evidence(tag, capability, version));
          },
          py::arg("tag"), py::arg("capability"), py::arg("version"),
          "(S_dc, F_dc): evidence summed over the active rubrics of the capability.")
      .def(
          "rubric_evidence",
          [](const SamplerCore& self, int32_t tag, int32_t slot, int64_t version) {
            return as_tuple(self.rubric_evidence(tag, slot, version));
          },
          py::arg("tag"), py::arg("slot"), py::arg("version"), "(S, F) of one (tag, rubric slot) cell.")
      .def(
          "task_state",
          [](const SamplerCore& self, int32_t task) {
            const auto state = self.task_state(task);
            return py::make_tuple(state.attempts, state.evaluated, state.applicable);
          },
          py::arg("task"), "(attempts, evaluated slots, slots with applicable evidence) of one task.")
      .def(
          "pair_probabilities",
          [](const SamplerCore& self, int64_t version, int64_t num_draws, uint64_t seed) {
            auto out = self.pair_probabilities(version, num_draws, seed);
            return py::make_tuple(out.probability, out.members);
          },
          py::arg("version"), py::arg("num_draws"), py::arg("seed"),
          "(probability per pair, member count per pair), pair = tag * num_capabilities + capability.")
      .def_property_readonly("num_tasks", &SamplerCore::num_tasks, "Number of tasks.")
      .def(
          "serialize", [](const SamplerCore& self) { return py::bytes(self.serialize()); },
          "Checksummed snapshot of the mutable state, generator included.")
      .def(
          "restore",
          [](SamplerCore& self, const py::bytes& data, const std::vector<int32_t>& slot_capability) {
            self.restore(std::string(data), slot_capability);
          },
          py::arg("data"), py::arg("slot_capability"),
          "Restores serialize() bytes of a sampler over the same tasks whose pool is slot_capability; "
          "all or nothing.");
}
