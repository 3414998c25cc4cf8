// Capability-based adaptive task sampling: Arise eq. 9-14 and appendix B.5.
//
// Everything here uses dense integer ids: tasks [0, num_tasks), tags
// [0, num_tags), capabilities [0, num_capabilities) and rubric slots. The
// Python CapabilitySampler maps its string ids onto these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evidence_store.h"
#include "rng.h"
#include "sum_tree.h"

namespace rwcore {

class ByteReader;  // serialize.h

enum VerdictCode : uint8_t { kFail = 0, kPass = 1, kNotApplicable = 2, kInvalid = 3 };

struct TaskState {
  int64_t attempts = 0;
  std::vector<int32_t> evaluated;   // slots in E(x)
  std::vector<int32_t> applicable;  // slots with at least one pass/fail verdict on x
};

struct PairProbabilities {
  std::vector<double> probability;  // [num_tags * num_capabilities], pair = tag * C + capability
  std::vector<int64_t> members;     // tasks of each pair with prior applicable evidence
};

class SamplerCore {
 public:
  SamplerCore(const std::vector<std::vector<int32_t>>& task_tags, int32_t num_tags,
              int32_t num_capabilities, int32_t batch_size, int32_t group_size, double rho_min,
              double quota_fraction, double gamma_obs, double gamma_unobs, uint64_t seed);

  // Replaces the active pool. slot_capability[s] is the capability of rubric
  // slot s or -1 for a free slot. A slot whose capability changes, and every
  // slot in reset_slots (a new rubric reusing a slot), loses its evidence,
  // coverage and applicability records first.
  void set_rubrics(const std::vector<int32_t>& slot_capability,
                   const std::vector<int32_t>& reset_slots);

  // One complete rollout group of `task`: codes is row-major [num_rubrics,
  // group_size] of VerdictCode, row r judged by rubric slot slots[r].
  void record_group(int32_t task, const std::vector<int32_t>& slots,
                    const std::vector<uint8_t>& codes, int64_t version);

  std::vector<int32_t> sample(int64_t version);

  double coverage() const;
  Evidence pair_evidence(int32_t tag, int32_t capability, int64_t version) const;
  Evidence rubric_evidence(int32_t tag, int32_t slot, int64_t version) const;
  TaskState task_state(int32_t task) const;
  // Monte Carlo of E[w_dc / sum w] over the pairs eligible at the start of a
  // batch, with its own generator so the sampler's stream is untouched.
  PairProbabilities pair_probabilities(int64_t version, int64_t num_draws, uint64_t seed) const;

  int32_t num_tasks() const { return num_tasks_; }
  const EvidenceStore& store() const { return store_; }

  // Mutable state (pool, records, evidence, generator) as a checksummed
  // snapshot; restore() accepts only a snapshot of a sampler over the same
  // tasks, tags and capabilities whose content is a state the public calls can
  // reach (a valid generator state; records and evidence only on active slots
  // and real tags, agreeing with each other; attempts behind every record),
  // and changes nothing when it refuses one.
  // expected_slot_capability is the caller's rubric table, which must match
  // the snapshot's.
  std::string serialize() const;
  void restore(const std::string& bytes, const std::vector<int32_t>& expected_slot_capability);

 private:
  size_t pair_index(int32_t tag, int32_t capability) const {
    return static_cast<size_t>(tag) * num_capabilities_ + capability;
  }
  uint64_t* evaluated_words(int32_t task) { return &evaluated_[static_cast<size_t>(task) * words_]; }
  uint64_t* applicable_words(int32_t task) { return &applicable_[static_cast<size_t>(task) * words_]; }
  bool has_bit(const std::vector<uint64_t>& bits, int32_t task, int32_t slot) const {
    return (bits[static_cast<size_t>(task) * words_ + slot / 64] >> (slot % 64)) & 1ULL;
  }
  void set_word_count(size_t words);
  void rebuild_derived();
  void update_weights(int32_t task);
  double inverse_attempt_weight(int32_t task) const { return 1.0 / (1.0 + static_cast<double>(attempts_[task])); }
  bool is_discovery_candidate(int32_t task) const { return evaluated_count_[task] < num_active_; }
  Evidence pair_evidence_unchecked(int32_t tag, int32_t capability, int64_t version) const;
  size_t draw_pair(const std::vector<size_t>& eligible, const std::vector<Evidence>& evidence,
                   Rng& rng, std::vector<double>& weights) const;
  int32_t draw_free_member(size_t pair, int64_t free_members, const std::vector<char>& taken);
  uint64_t task_fingerprint() const;
  // Throws through `reader` (naming the snapshot) unless the decoded state is
  // one the public calls can reach; see restore().
  void check_invariants(const ByteReader& reader, const std::vector<int32_t>& slot_capability, size_t words,
                        const std::vector<uint64_t>& evaluated, const std::vector<uint64_t>& applicable,
                        const std::vector<int64_t>& attempts, const Rng::State& rng_state,
                        const EvidenceStore& store) const;

  // Fixed at construction.
  int32_t num_tasks_;
  int32_t num_tags_;
  int32_t num_capabilities_;
  int32_t batch_size_;
  int32_t group_size_;
  double rho_min_;
  double quota_fraction_;
  std::vector<int64_t> tag_offsets_;  // CSR over tasks
  std::vector<int32_t> tags_;

  // Mutable state that snapshots hold.
  std::vector<int32_t> slot_capability_;
  size_t words_ = 1;
  std::vector<uint64_t> evaluated_;   // [num_tasks, words_] bitsets: E(x)
  std::vector<uint64_t> applicable_;  // [num_tasks, words_] bitsets: pass/fail seen
  std::vector<int64_t> attempts_;     // a_x
  EvidenceStore store_;               // keyed (tag, slot)
  Rng rng_;

  // Derived from the above by rebuild_derived().
  int32_t num_active_ = 0;
  std::vector<std::vector<int32_t>> capability_slots_;  // active slots per capability
  std::vector<int32_t> evaluated_count_;                // |E(x) ∩ active|
  std::vector<uint64_t> capability_evidence_;           // bit c: applicable evidence for c
  std::vector<int64_t> capability_evaluated_total_;     // sum_x |E(x) ∩ R_c|
  std::vector<std::vector<int32_t>> members_;           // sorted tasks per (tag, capability)
  SumTree discovery_tree_;                              // 1/(1+a_x) on discovery candidates
  SumTree fallback_tree_;                               // 1/(1+a_x) on every task
};

}  // namespace rwcore
