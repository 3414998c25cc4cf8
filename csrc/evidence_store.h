// Decayed Beta evidence per (task-type tag, rubric): Arise eq. 20 / appendix B.5.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rwcore {

struct Evidence {
  double success = 0.0;
  double failure = 0.0;
};

// One (tag, rubric) accumulator and the policy version of its last update.
struct EvidenceCell {
  double success = 0.0;
  double failure = 0.0;
  int64_t version = 0;
};

// Thread-safe: writers take an exclusive lock, queries a shared one. Every
// public mutator validates all of its input before touching the store, so a
// rejected call leaves it unchanged.
class EvidenceStore {
 public:
  // Ids are unsigned 32-bit values so a (tag, rubric) pair packs into one key.
  static constexpr int64_t kMaxId = (int64_t{1} << 32) - 1;

  EvidenceStore(double gamma_obs, double gamma_unobs);
  EvidenceStore(const EvidenceStore& other);
  EvidenceStore& operator=(const EvidenceStore& other);

  double gamma_obs() const { return gamma_obs_; }
  double gamma_unobs() const { return gamma_unobs_; }

  // Adds one observation (dS, dF) made by the policy at `version`.
  void observe(int64_t tag, int64_t rubric, double success, double failure, int64_t version);
  // The same as calling observe() for each index in order, under one lock.
  void observe_many(const int64_t* tags, const int64_t* rubrics, const double* successes,
                    const double* failures, const int64_t* versions, size_t count);

  // Evidence as seen by the policy at `version`; (0, 0) for an unseen pair.
  Evidence query(int64_t tag, int64_t rubric, int64_t version) const;
  Evidence query_sum(int64_t tag, const int64_t* rubrics, size_t count, int64_t version) const;
  void query_many(const int64_t* tags, const int64_t* rubrics, size_t count, int64_t version,
                  double* successes, double* failures) const;

  // Deletes every accumulator of `rubric`; returns how many there were.
  size_t remove_rubric(int64_t rubric);
  size_t size() const;

  // Cells sorted by (tag, rubric): a canonical order for snapshots and tests.
  std::vector<std::pair<std::pair<int64_t, int64_t>, EvidenceCell>> cells() const;

  std::string serialize() const;
  static EvidenceStore deserialize(const std::string& bytes, const std::string& what);

 private:
  static uint64_t key(int64_t tag, int64_t rubric) {
    return (static_cast<uint64_t>(tag) << 32) | static_cast<uint64_t>(rubric);
  }
  void apply(int64_t tag, int64_t rubric, double success, double failure, int64_t version);
  Evidence decayed(const EvidenceCell& cell, int64_t version) const;

  double gamma_obs_;
  double gamma_unobs_;
  std::unordered_map<uint64_t, EvidenceCell> cells_;
  mutable std::shared_mutex mutex_;
};

// Input checks shared with the sampler; each throws std::invalid_argument
// naming `name`.
void check_id(int64_t value, const char* name);
void check_version(int64_t value, const char* name);
void check_evidence(double value, const char* name);
void check_gamma(double value, const char* name);

}  // namespace rwcore
