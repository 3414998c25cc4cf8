#include "sampler_core.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "serialize.h"

namespace rwcore {
namespace {

constexpr char kSamplerMagic[8] = {'R', 'W', 'S', 'A', 'M', 'P', 'L', 'R'};
constexpr uint32_t kSamplerFormat = 1;
constexpr int32_t kMaxCapabilities = 64;  // capabilities are bits of one word per task

[[noreturn]] void invalid(const std::string& message) { throw std::invalid_argument(message); }

}  // namespace

SamplerCore::SamplerCore(const std::vector<std::vector<int32_t>>& task_tags, int32_t num_tags,
                         int32_t num_capabilities, int32_t batch_size, int32_t group_size,
                         double rho_min, double quota_fraction, double gamma_obs,
                         double gamma_unobs, uint64_t seed)
    : num_tasks_(static_cast<int32_t>(task_tags.size())),
      num_tags_(num_tags),
      num_capabilities_(num_capabilities),
      batch_size_(batch_size),
      group_size_(group_size),
      rho_min_(rho_min),
      quota_fraction_(quota_fraction),
      store_(gamma_obs, gamma_unobs),
      rng_(seed) {
  if (task_tags.empty()) invalid("tasks must not be empty");
  if (task_tags.size() > static_cast<size_t>(INT32_MAX)) invalid("tasks: too many tasks");
  if (num_tags < 0 || num_tags > EvidenceStore::kMaxId) invalid("num_tags out of range");
  if (num_capabilities < 1 || num_capabilities > kMaxCapabilities)
    invalid("capabilities must hold between 1 and 64 names, got " + std::to_string(num_capabilities));
  if (batch_size < 1 || batch_size > num_tasks_)
    invalid("batch_size must be in [1, number of tasks = " + std::to_string(num_tasks_) + "], got " +
            std::to_string(batch_size));
  if (group_size < 1) invalid("group_size must be >= 1, got " + std::to_string(group_size));
  if (!(rho_min >= 0.0 && rho_min <= 1.0)) invalid("rho_min must be in [0, 1]");
  if (!(quota_fraction >= 0.0 && quota_fraction <= 1.0)) invalid("quota_fraction must be in [0, 1]");

  tag_offsets_.reserve(task_tags.size() + 1);
  tag_offsets_.push_back(0);
  for (const auto& tags : task_tags) {
    for (int32_t tag : tags) {
      if (tag < 0 || tag >= num_tags) invalid("tasks: tag index out of range");
      tags_.push_back(tag);
    }
    tag_offsets_.push_back(static_cast<int64_t>(tags_.size()));
  }
  attempts_.assign(num_tasks_, 0);
  set_word_count(1);
  rebuild_derived();
}

void SamplerCore::set_word_count(size_t words) {
  // Re-lays the per-task bitsets when the pool outgrows them.
  std::vector<uint64_t> evaluated(static_cast<size_t>(num_tasks_) * words, 0);
  std::vector<uint64_t> applicable(static_cast<size_t>(num_tasks_) * words, 0);
  if (!evaluated_.empty()) {
    const size_t keep = std::min(words, words_);
    for (int32_t x = 0; x < num_tasks_; ++x)
      for (size_t w = 0; w < keep; ++w) {
        evaluated[x * words + w] = evaluated_[x * words_ + w];
        applicable[x * words + w] = applicable_[x * words_ + w];
      }
  }
  evaluated_ = std::move(evaluated);
  applicable_ = std::move(applicable);
  words_ = words;
}

void SamplerCore::rebuild_derived() {
  num_active_ = 0;
  capability_slots_.assign(num_capabilities_, {});
  std::vector<uint64_t> active(words_, 0);
  std::vector<std::vector<uint64_t>> capability_mask(num_capabilities_, std::vector<uint64_t>(words_, 0));
  for (size_t s = 0; s < slot_capability_.size(); ++s) {
    const int32_t c = slot_capability_[s];
    if (c < 0) continue;
    ++num_active_;
    capability_slots_[c].push_back(static_cast<int32_t>(s));
    active[s / 64] |= 1ULL << (s % 64);
    capability_mask[c][s / 64] |= 1ULL << (s % 64);
  }

  evaluated_count_.assign(num_tasks_, 0);
  capability_evidence_.assign(num_tasks_, 0);
  capability_evaluated_total_.assign(num_capabilities_, 0);
  members_.assign(static_cast<size_t>(num_tags_) * num_capabilities_, {});
  std::vector<double> discovery(num_tasks_), fallback(num_tasks_);
  for (int32_t x = 0; x < num_tasks_; ++x) {
    const uint64_t* evaluated = &evaluated_[static_cast<size_t>(x) * words_];
    const uint64_t* applicable = &applicable_[static_cast<size_t>(x) * words_];
    for (size_t w = 0; w < words_; ++w) evaluated_count_[x] += std::popcount(evaluated[w] & active[w]);
    for (int32_t c = 0; c < num_capabilities_; ++c) {
      bool has_evidence = false;
      for (size_t w = 0; w < words_; ++w) {
        capability_evaluated_total_[c] += std::popcount(evaluated[w] & capability_mask[c][w]);
        has_evidence |= (applicable[w] & capability_mask[c][w]) != 0;
      }
      if (!has_evidence) continue;
      capability_evidence_[x] |= 1ULL << c;
      // Tasks are visited in increasing order, so every list comes out sorted.
      for (int64_t k = tag_offsets_[x]; k < tag_offsets_[x + 1]; ++k)
        members_[pair_index(tags_[k], c)].push_back(x);
    }
    fallback[x] = inverse_attempt_weight(x);
    discovery[x] = is_discovery_candidate(x) ? fallback[x] : 0.0;
  }
  discovery_tree_.resize(num_tasks_);
  fallback_tree_.resize(num_tasks_);
  discovery_tree_.assign(discovery);
  fallback_tree_.assign(fallback);
}

void SamplerCore::update_weights(int32_t task) {
  const double weight = inverse_attempt_weight(task);
  fallback_tree_.set(task, weight);
  discovery_tree_.set(task, is_discovery_candidate(task) ? weight : 0.0);
}

void SamplerCore::set_rubrics(const std::vector<int32_t>& slot_capability,
                              const std::vector<int32_t>& reset_slots) {
  for (int32_t c : slot_capability)
    if (c < -1 || c >= num_capabilities_) invalid("capability index out of range");
  const size_t num_slots = std::max(slot_capability.size(), slot_capability_.size());
  for (int32_t s : reset_slots)
    if (s < 0 || static_cast<size_t>(s) >= num_slots) invalid("reset slot out of range");

  std::vector<char> reset(num_slots, 0);
  for (int32_t s : reset_slots) reset[s] = 1;
  for (size_t s = 0; s < num_slots; ++s) {
    const int32_t before = s < slot_capability_.size() ? slot_capability_[s] : -1;
    const int32_t after = s < slot_capability.size() ? slot_capability[s] : -1;
    if (before != after) reset[s] = 1;
  }
  for (size_t s = 0; s < num_slots; ++s) {
    if (!reset[s]) continue;
    store_.remove_rubric(static_cast<int64_t>(s));
    if (s / 64 >= words_) continue;
    const uint64_t keep = ~(1ULL << (s % 64));
    for (int32_t x = 0; x < num_tasks_; ++x) {
      evaluated_[static_cast<size_t>(x) * words_ + s / 64] &= keep;
      applicable_[static_cast<size_t>(x) * words_ + s / 64] &= keep;
    }
  }
  slot_capability_ = slot_capability;
  while (!slot_capability_.empty() && slot_capability_.back() < 0) slot_capability_.pop_back();
  const size_t words = std::max<size_t>(1, (slot_capability_.size() + 63) / 64);
  if (words > words_) set_word_count(words);
  rebuild_derived();
}

void SamplerCore::record_group(int32_t task, const std::vector<int32_t>& slots,
                               const std::vector<uint8_t>& codes, int64_t version) {
  if (task < 0 || task >= num_tasks_) invalid("task_id: index out of range");
  check_version(version, "policy_version");
  const size_t num_rubrics = slots.size();
  const size_t group = static_cast<size_t>(group_size_);
  if (codes.size() != num_rubrics * group)
    invalid("verdicts: expected " + std::to_string(num_rubrics) + " x group_size=" +
            std::to_string(group_size_) + " verdicts, got " + std::to_string(codes.size()));
  std::vector<char> seen(slot_capability_.size(), 0);
  for (int32_t s : slots) {
    if (s < 0 || static_cast<size_t>(s) >= slot_capability_.size() || slot_capability_[s] < 0)
      invalid("verdicts: rubric slot " + std::to_string(s) + " is not in the active pool");
    if (seen[s]) invalid("verdicts: a rubric appears twice");
    seen[s] = 1;
  }
  for (uint8_t code : codes)
    if (code > kInvalid) invalid("verdicts: unknown verdict code " + std::to_string(code));

  // Eq. 9-10 split over the applicable rubric evaluations (B.5): verdict y on
  // rubric i adds y/|R_c(tau_j)| to S and (1-y)/|R_c(tau_j)| to F.
  std::vector<double> success(num_rubrics, 0.0), failure(num_rubrics, 0.0);
  std::vector<char> any_applicable(num_rubrics, 0);
  std::vector<int32_t> applicable_per_capability(num_capabilities_);
  for (size_t j = 0; j < group; ++j) {
    std::fill(applicable_per_capability.begin(), applicable_per_capability.end(), 0);
    for (size_t r = 0; r < num_rubrics; ++r)
      if (codes[r * group + j] <= kPass) ++applicable_per_capability[slot_capability_[slots[r]]];
    for (size_t r = 0; r < num_rubrics; ++r) {
      const uint8_t code = codes[r * group + j];
      if (code > kPass) continue;
      const double size = applicable_per_capability[slot_capability_[slots[r]]];
      const double y = code == kPass ? 1.0 : 0.0;
      success[r] += y / size;
      failure[r] += (1.0 - y) / size;
      any_applicable[r] = 1;
    }
  }

  std::vector<int64_t> cell_tags, cell_slots, versions;
  std::vector<double> cell_success, cell_failure;
  for (int64_t k = tag_offsets_[task]; k < tag_offsets_[task + 1]; ++k)
    for (size_t r = 0; r < num_rubrics; ++r) {
      if (!any_applicable[r]) continue;  // no evidence: the cell's clock is not touched
      cell_tags.push_back(tags_[k]);
      cell_slots.push_back(slots[r]);
      cell_success.push_back(success[r]);
      cell_failure.push_back(failure[r]);
      versions.push_back(version);
    }
  store_.observe_many(cell_tags.data(), cell_slots.data(), cell_success.data(), cell_failure.data(),
                      versions.data(), cell_tags.size());

  uint64_t* evaluated = evaluated_words(task);
  uint64_t* applicable = applicable_words(task);
  for (size_t r = 0; r < num_rubrics; ++r) {
    const int32_t s = slots[r];
    const int32_t c = slot_capability_[s];
    const uint64_t bit = 1ULL << (s % 64);
    bool all_valid = true;
    for (size_t j = 0; j < group; ++j) all_valid &= codes[r * group + j] != kInvalid;
    if (all_valid && !(evaluated[s / 64] & bit)) {
      evaluated[s / 64] |= bit;
      ++evaluated_count_[task];
      ++capability_evaluated_total_[c];
    }
    if (!any_applicable[r]) continue;
    applicable[s / 64] |= bit;
    if (capability_evidence_[task] & (1ULL << c)) continue;
    capability_evidence_[task] |= 1ULL << c;
    for (int64_t k = tag_offsets_[task]; k < tag_offsets_[task + 1]; ++k) {
      auto& members = members_[pair_index(tags_[k], c)];
      members.insert(std::lower_bound(members.begin(), members.end(), task), task);
    }
  }
  ++attempts_[task];
  update_weights(task);
}

double SamplerCore::coverage() const {
  if (num_active_ == 0) return 0.0;
  double sum = 0.0;
  int32_t represented = 0;
  for (int32_t c = 0; c < num_capabilities_; ++c) {
    if (capability_slots_[c].empty()) continue;
    ++represented;
    sum += static_cast<double>(capability_evaluated_total_[c]) /
           static_cast<double>(capability_slots_[c].size());
  }
  return sum / (static_cast<double>(num_tasks_) * represented);
}

Evidence SamplerCore::pair_evidence_unchecked(int32_t tag, int32_t capability, int64_t version) const {
  const auto& slots = capability_slots_[capability];
  std::vector<int64_t> rubrics(slots.begin(), slots.end());
  return store_.query_sum(tag, rubrics.data(), rubrics.size(), version);
}

Evidence SamplerCore::pair_evidence(int32_t tag, int32_t capability, int64_t version) const {
  if (tag < 0 || tag >= num_tags_) invalid("tag: index out of range");
  if (capability < 0 || capability >= num_capabilities_) invalid("capability: index out of range");
  check_version(version, "policy_version");
  return pair_evidence_unchecked(tag, capability, version);
}

Evidence SamplerCore::rubric_evidence(int32_t tag, int32_t slot, int64_t version) const {
  if (tag < 0 || tag >= num_tags_) invalid("tag: index out of range");
  check_version(version, "policy_version");
  return store_.query(tag, slot, version);
}

TaskState SamplerCore::task_state(int32_t task) const {
  if (task < 0 || task >= num_tasks_) invalid("task_id: index out of range");
  TaskState state;
  state.attempts = attempts_[task];
  for (size_t s = 0; s < slot_capability_.size(); ++s) {
    if (slot_capability_[s] < 0) continue;
    if (has_bit(evaluated_, task, static_cast<int32_t>(s))) state.evaluated.push_back(static_cast<int32_t>(s));
    if (has_bit(applicable_, task, static_cast<int32_t>(s))) state.applicable.push_back(static_cast<int32_t>(s));
  }
  return state;
}

size_t SamplerCore::draw_pair(const std::vector<size_t>& eligible, const std::vector<Evidence>& evidence,
                              Rng& rng, std::vector<double>& weights) const {
  // Eq. 13-14: a fresh Beta draw per eligible pair, weight p (1 - p)^2.
  weights.resize(eligible.size());
  double total = 0.0;
  for (size_t k = 0; k < eligible.size(); ++k) {
    const Evidence& e = evidence[eligible[k]];
    const double p = rng.beta(1.0 + e.success, 1.0 + e.failure);
    const double w = p * (1.0 - p) * (1.0 - p);
    weights[k] = w;
    total += w;
  }
  if (!(total > 0.0)) {
    // Every draw underflowed to p = 0 or 1: no pair is preferred.
    std::fill(weights.begin(), weights.end(), 1.0);
    total = static_cast<double>(eligible.size());
  }
  double target = rng.uniform() * total;
  for (size_t k = 0; k < eligible.size(); ++k) {
    if (target < weights[k]) return k;
    target -= weights[k];
  }
  for (size_t k = eligible.size(); k-- > 0;)
    if (weights[k] > 0.0) return k;
  return eligible.size() - 1;
}

int32_t SamplerCore::draw_free_member(size_t pair, int64_t free_members, const std::vector<char>& taken) {
  const auto& members = members_[pair];
  const uint64_t size = members.size();
  // Rejection is exactly uniform over the free members and needs few tries
  // while most are free; a scan finishes the rare crowded case.
  for (int attempt = 0; attempt < 32; ++attempt) {
    const int32_t task = members[rng_.below(size)];
    if (!taken[task]) return task;
  }
  uint64_t rank = rng_.below(static_cast<uint64_t>(free_members));
  for (int32_t task : members)
    if (!taken[task] && rank-- == 0) return task;
  invalid("internal error: no free member in a pair counted as free");
}

std::vector<int32_t> SamplerCore::sample(int64_t version) {
  check_version(version, "policy_version");
  const size_t num_pairs = members_.size();
  const int64_t quota = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(quota_fraction_ * batch_size_)));
  const double rho = std::max(rho_min_, 1.0 - coverage());

  std::vector<int64_t> free_members(num_pairs);
  std::vector<int64_t> targeted(num_pairs, 0);
  std::vector<Evidence> evidence(num_pairs);
  for (size_t p = 0; p < num_pairs; ++p) {
    free_members[p] = static_cast<int64_t>(members_[p].size());
    if (free_members[p] > 0)
      evidence[p] = pair_evidence_unchecked(static_cast<int32_t>(p / num_capabilities_),
                                            static_cast<int32_t>(p % num_capabilities_), version);
  }

  std::vector<int32_t> batch;
  batch.reserve(batch_size_);
  std::vector<char> taken(num_tasks_, 0);
  std::vector<size_t> eligible;
  std::vector<double> weights;
  while (static_cast<int32_t>(batch.size()) < batch_size_) {
    int32_t task;
    const bool discovery_available = discovery_tree_.total() > 0.0;
    if (discovery_available && rng_.uniform() < rho) {
      task = static_cast<int32_t>(discovery_tree_.find(rng_.uniform() * discovery_tree_.total()));
    } else {
      eligible.clear();
      for (size_t p = 0; p < num_pairs; ++p)
        if (free_members[p] > 0 && targeted[p] < quota) eligible.push_back(p);
      if (!eligible.empty()) {
        const size_t pair = eligible[draw_pair(eligible, evidence, rng_, weights)];
        ++targeted[pair];
        task = draw_free_member(pair, free_members[pair], taken);
      } else {
        // Adaptive selection unavailable: inverse-attempt weights, discovery
        // candidates first.
        const SumTree& tree = discovery_available ? discovery_tree_ : fallback_tree_;
        task = static_cast<int32_t>(tree.find(rng_.uniform() * tree.total()));
      }
    }
    batch.push_back(task);
    taken[task] = 1;
    discovery_tree_.set(task, 0.0);
    fallback_tree_.set(task, 0.0);
    for (int64_t k = tag_offsets_[task]; k < tag_offsets_[task + 1]; ++k)
      for (int32_t c = 0; c < num_capabilities_; ++c)
        if (capability_evidence_[task] & (1ULL << c)) --free_members[pair_index(tags_[k], c)];
  }
  for (int32_t task : batch) update_weights(task);
  return batch;
}

PairProbabilities SamplerCore::pair_probabilities(int64_t version, int64_t num_draws, uint64_t seed) const {
  check_version(version, "policy_version");
  if (num_draws < 1) invalid("num_draws must be >= 1, got " + std::to_string(num_draws));
  const size_t num_pairs = members_.size();
  PairProbabilities out;
  out.probability.assign(num_pairs, 0.0);
  out.members.resize(num_pairs);
  std::vector<Evidence> evidence(num_pairs);
  std::vector<size_t> eligible;
  for (size_t p = 0; p < num_pairs; ++p) {
    out.members[p] = static_cast<int64_t>(members_[p].size());
    if (members_[p].empty()) continue;
    eligible.push_back(p);
    evidence[p] = pair_evidence_unchecked(static_cast<int32_t>(p / num_capabilities_),
                                          static_cast<int32_t>(p % num_capabilities_), version);
  }
  if (eligible.empty()) return out;
  Rng rng(seed);
  std::vector<double> weights;
  for (int64_t draw = 0; draw < num_draws; ++draw) {
    double total = 0.0;
    weights.resize(eligible.size());
    for (size_t k = 0; k < eligible.size(); ++k) {
      const Evidence& e = evidence[eligible[k]];
      const double p = rng.beta(1.0 + e.success, 1.0 + e.failure);
      weights[k] = p * (1.0 - p) * (1.0 - p);
      total += weights[k];
    }
    for (size_t k = 0; k < eligible.size(); ++k)
      out.probability[eligible[k]] += total > 0.0 ? weights[k] / total : 1.0 / eligible.size();
  }
  for (size_t p : eligible) out.probability[p] /= static_cast<double>(num_draws);
  return out;
}

uint64_t SamplerCore::task_fingerprint() const {
  std::string bytes;
  auto append = [&bytes](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
  };
  append(&num_tasks_, sizeof(num_tasks_));
  append(&num_tags_, sizeof(num_tags_));
  append(&num_capabilities_, sizeof(num_capabilities_));
  append(tag_offsets_.data(), tag_offsets_.size() * sizeof(int64_t));
  append(tags_.data(), tags_.size() * sizeof(int32_t));
  return fnv1a64(bytes.data(), bytes.size());
}

std::string SamplerCore::serialize() const {
  ByteWriter writer(kSamplerMagic, kSamplerFormat);
  writer.put<uint64_t>(task_fingerprint());
  writer.put_vector(slot_capability_);
  writer.put<uint64_t>(words_);
  writer.put_vector(evaluated_);
  writer.put_vector(applicable_);
  writer.put_vector(attempts_);
  for (uint64_t word : rng_.state()) writer.put<uint64_t>(word);
  writer.put_bytes(store_.serialize());
  return writer.finish();
}

void SamplerCore::check_invariants(const ByteReader& reader, const std::vector<int32_t>& slot_capability,
                                   size_t words, const std::vector<uint64_t>& evaluated,
                                   const std::vector<uint64_t>& applicable, const std::vector<int64_t>& attempts,
                                   const Rng::State& rng_state, const EvidenceStore& store) const {
  // What every state the public calls can reach satisfies, beyond the
  // checksum (which only proves the bytes are the ones written): a usable
  // generator, records and evidence only on active slots and real tags, and
  // records that agree with the evidence they came with.
  if (!Rng::valid_state(rng_state))
    reader.fail("holds an invalid generator state (all zero: the generator would only return zeros and "
                "sample() would never finish)");
  std::vector<uint64_t> active(words, 0);
  for (size_t s = 0; s < slot_capability.size(); ++s)
    if (slot_capability[s] >= 0) active[s / 64] |= 1ULL << (s % 64);
  // Evidence cell (d, s) <=> some task tagged d has an applicability record on s.
  const auto key = [](uint64_t tag, uint64_t slot) { return (tag << 32) | slot; };
  std::unordered_map<uint64_t, bool> accounted;  // cell -> seen from a record
  for (const auto& [ids, cell] : store.cells()) {
    const auto [tag, slot] = ids;
    if (tag >= num_tags_ || static_cast<size_t>(slot) >= slot_capability.size() || slot_capability[slot] < 0)
      reader.fail("holds evidence for tag " + std::to_string(tag) + ", rubric slot " + std::to_string(slot) +
                  ", outside its tasks' tags or its pool");
    accounted.emplace(key(tag, slot), false);
  }
  for (int32_t x = 0; x < num_tasks_; ++x) {
    const uint64_t* e = &evaluated[static_cast<size_t>(x) * words];
    const uint64_t* a = &applicable[static_cast<size_t>(x) * words];
    bool any = false;
    for (size_t w = 0; w < words; ++w) {
      if ((e[w] | a[w]) & ~active[w])
        reader.fail("holds records of task " + std::to_string(x) + " on rubric slots that are not in its pool");
      any |= (e[w] | a[w]) != 0;
    }
    if (any && attempts[x] == 0)
      reader.fail("holds records of task " + std::to_string(x) + ", which has no recorded attempt");
    for (size_t w = 0; w < words; ++w)
      for (uint64_t bits = a[w]; bits; bits &= bits - 1) {
        const uint64_t slot = w * 64 + static_cast<uint64_t>(std::countr_zero(bits));
        for (int64_t k = tag_offsets_[x]; k < tag_offsets_[x + 1]; ++k) {
          auto found = accounted.find(key(static_cast<uint64_t>(tags_[k]), slot));
          if (found == accounted.end())
            reader.fail("holds an applicability record (task " + std::to_string(x) + ", rubric slot " +
                        std::to_string(slot) + ") without the evidence it adds");
          found->second = true;
        }
      }
  }
  for (const auto& [cell_key, seen] : accounted)
    if (!seen)
      reader.fail("holds evidence for tag " + std::to_string(cell_key >> 32) + ", rubric slot " +
                  std::to_string(cell_key & 0xFFFFFFFFULL) + " that no task's applicability record accounts for");
}

void SamplerCore::restore(const std::string& bytes,
                          const std::vector<int32_t>& expected_slot_capability) {
  ByteReader reader(bytes, kSamplerMagic, kSamplerFormat, "sampler state");
  if (reader.get<uint64_t>() != task_fingerprint())
    reader.fail("was saved by a sampler over a different task set (tasks, tags or capabilities differ)");
  const uint64_t limit = bytes.size();
  auto slot_capability = reader.get_vector<int32_t>(limit);
  const auto words = reader.get<uint64_t>();
  auto evaluated = reader.get_vector<uint64_t>(limit);
  auto applicable = reader.get_vector<uint64_t>(limit);
  auto attempts = reader.get_vector<int64_t>(limit);
  Rng::State rng_state;
  for (auto& word : rng_state) word = reader.get<uint64_t>();
  EvidenceStore store = EvidenceStore::deserialize(reader.get_bytes(), "sampler state's evidence store");
  reader.expect_end();

  for (int32_t c : slot_capability)
    if (c < -1 || c >= num_capabilities_) reader.fail("holds a capability index out of range");
  if (slot_capability != expected_slot_capability)
    reader.fail("does not match its rubric table (rubric slots or capabilities differ)");
  const size_t expected_words = std::max<size_t>(1, (slot_capability.size() + 63) / 64);
  if (words < expected_words || words > expected_words + 1024 ||
      evaluated.size() != static_cast<size_t>(num_tasks_) * words ||
      applicable.size() != evaluated.size() || attempts.size() != static_cast<size_t>(num_tasks_))
    reader.fail("holds arrays of inconsistent sizes");
  for (int64_t a : attempts)
    if (a < 0) reader.fail("holds a negative attempt count");
  if (store.gamma_obs() != store_.gamma_obs() || store.gamma_unobs() != store_.gamma_unobs())
    reader.fail("was saved with different gamma_obs / gamma_unobs");
  check_invariants(reader, slot_capability, words, evaluated, applicable, attempts, rng_state, store);

  slot_capability_ = std::move(slot_capability);
  words_ = words;
  evaluated_ = std::move(evaluated);
  applicable_ = std::move(applicable);
  attempts_ = std::move(attempts);
  rng_.set_state(rng_state);
  store_ = store;
  rebuild_derived();
}

}  // namespace rwcore
