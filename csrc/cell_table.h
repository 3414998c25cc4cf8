// Evidence cells keyed by (tag, rubric), laid out for one lookup per observation.
//
// Ids in practice are small dense integers (task-type tags, rubric slots), so
// cells whose ids fall inside a grid live in a dense row-major array indexed
// directly: no hashing, and neighbouring rubrics of a tag share cache lines.
// Ids outside the grid (anything up to 2**32 - 1 is allowed) go to an
// open-addressing hash table with linear probing at load <= 1/2. A cell with
// version -1 marks an empty place in either (real versions are >= 0).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace rwcore {

// One (tag, rubric) accumulator and the policy version of its last update.
struct EvidenceCell {
  double success = 0.0;
  double failure = 0.0;
  int64_t version = -1;
};

class CellTable {
 public:
  // The grid grows to cover the ids it sees up to these bounds.
  static constexpr uint64_t kGridTagLimit = uint64_t{1} << 16;
  static constexpr uint64_t kGridRubricLimit = uint64_t{1} << 12;
  static constexpr uint64_t kGridCellLimit = uint64_t{1} << 18;

  CellTable() { clear(); }

  // Counts the grid's cells rather than keeping a tally, which would put a
  // read-modify-write of one counter on every observation's path.
  size_t size() const {
    size_t count = sparse_size_;
    for (const EvidenceCell& cell : grid_) count += cell.version >= 0;
    return count;
  }

  void clear() {
    grid_.clear();
    grid_tags_ = 0;
    grid_rubrics_ = 0;
    sparse_.assign(16, Entry{});
    shift_ = 64 - 4;
    sparse_size_ = 0;
  }

  // The cell of (tag, rubric), or nullptr.
  const EvidenceCell* find(uint64_t tag, uint64_t rubric) const {
    if (in_grid(tag, rubric)) {
      const EvidenceCell& cell = grid_[tag * grid_rubrics_ + rubric];
      return cell.version < 0 ? nullptr : &cell;
    }
    const uint64_t key = pack(tag, rubric);
    for (size_t i = home(key);; i = (i + 1) & mask()) {
      const Entry& entry = sparse_[i];
      if (entry.cell.version < 0) return nullptr;
      if (entry.key == key) return &entry.cell;
    }
  }

  // The cell of (tag, rubric) and whether it is new (then empty, version -1:
  // the caller must fill it in).
  std::pair<EvidenceCell*, bool> find_or_insert(uint64_t tag, uint64_t rubric) {
    if (!in_grid(tag, rubric) && fits_grid(tag, rubric)) grow_grid(tag, rubric);
    if (in_grid(tag, rubric)) {
      EvidenceCell& cell = grid_[tag * grid_rubrics_ + rubric];
      return {&cell, cell.version < 0};
    }
    if (2 * (sparse_size_ + 1) > sparse_.size()) grow_sparse();
    const uint64_t key = pack(tag, rubric);
    for (size_t i = home(key);; i = (i + 1) & mask()) {
      Entry& entry = sparse_[i];
      if (entry.cell.version < 0) {
        entry.key = key;
        ++sparse_size_;
        return {&entry.cell, true};
      }
      if (entry.key == key) return {&entry.cell, false};
    }
  }

  // Removes every cell of `rubric`; returns how many.
  size_t erase_rubric(uint64_t rubric) {
    size_t removed = 0;
    if (rubric < grid_rubrics_) {
      for (uint64_t tag = 0; tag < grid_tags_; ++tag) {
        EvidenceCell& cell = grid_[tag * grid_rubrics_ + rubric];
        if (cell.version >= 0) {
          cell = EvidenceCell{};
          ++removed;
        }
      }
    }
    std::vector<Entry> kept;
    size_t sparse_removed = 0;
    for (const Entry& entry : sparse_) {
      if (entry.cell.version < 0) continue;
      if ((entry.key & 0xFFFFFFFFULL) == rubric)
        ++sparse_removed;
      else
        kept.push_back(entry);
    }
    if (sparse_removed) rebuild_sparse(kept);
    return removed + sparse_removed;
  }

  // Calls visit(tag, rubric, cell) for every cell, in no particular order.
  template <typename Visit>
  void for_each(Visit visit) const {
    for (uint64_t tag = 0; tag < grid_tags_; ++tag)
      for (uint64_t rubric = 0; rubric < grid_rubrics_; ++rubric) {
        const EvidenceCell& cell = grid_[tag * grid_rubrics_ + rubric];
        if (cell.version >= 0) visit(tag, rubric, cell);
      }
    for (const Entry& entry : sparse_)
      if (entry.cell.version >= 0) visit(entry.key >> 32, entry.key & 0xFFFFFFFFULL, entry.cell);
  }

 private:
  struct Entry {
    uint64_t key = 0;
    EvidenceCell cell;
  };

  static uint64_t pack(uint64_t tag, uint64_t rubric) { return (tag << 32) | rubric; }
  static uint64_t round_up(uint64_t n) {
    uint64_t p = 1;
    while (p < n) p <<= 1;
    return p;
  }
  bool in_grid(uint64_t tag, uint64_t rubric) const { return tag < grid_tags_ && rubric < grid_rubrics_; }
  static bool fits_grid(uint64_t tag, uint64_t rubric) {
    return tag < kGridTagLimit && rubric < kGridRubricLimit &&
           round_up(tag + 1) * round_up(rubric + 1) <= kGridCellLimit;
  }

  void grow_grid(uint64_t tag, uint64_t rubric) {
    const uint64_t tags = std::max<uint64_t>(grid_tags_, round_up(tag + 1));
    const uint64_t rubrics = std::max<uint64_t>(grid_rubrics_, round_up(rubric + 1));
    if (tags * rubrics > kGridCellLimit) return;  // stays sparse
    std::vector<EvidenceCell> grid(tags * rubrics);
    for (uint64_t t = 0; t < grid_tags_; ++t)
      std::copy_n(&grid_[t * grid_rubrics_], grid_rubrics_, &grid[t * rubrics]);
    grid_ = std::move(grid);
    grid_tags_ = static_cast<uint32_t>(tags);
    grid_rubrics_ = static_cast<uint32_t>(rubrics);
    // Sparse cells that now fall inside the grid move into it.
    std::vector<Entry> kept;
    bool moved = false;
    for (const Entry& entry : sparse_) {
      if (entry.cell.version < 0) continue;
      const uint64_t t = entry.key >> 32, r = entry.key & 0xFFFFFFFFULL;
      if (in_grid(t, r)) {
        grid_[t * grid_rubrics_ + r] = entry.cell;
        moved = true;
      } else {
        kept.push_back(entry);
      }
    }
    if (moved) rebuild_sparse(kept);
  }

  size_t mask() const { return sparse_.size() - 1; }
  size_t home(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_); }

  void grow_sparse() {
    std::vector<Entry> entries;
    for (const Entry& entry : sparse_)
      if (entry.cell.version >= 0) entries.push_back(entry);
    rebuild_sparse(entries, sparse_.size() * 2);
  }

  void rebuild_sparse(const std::vector<Entry>& entries, size_t capacity = 16) {
    while (2 * entries.size() > capacity) capacity *= 2;
    sparse_.assign(capacity, Entry{});
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    for (const Entry& entry : entries) {
      size_t i = home(entry.key);
      while (sparse_[i].cell.version >= 0) i = (i + 1) & mask();
      sparse_[i] = entry;
    }
    sparse_size_ = entries.size();
  }

  std::vector<EvidenceCell> grid_;  // [grid_tags_, grid_rubrics_], both powers of two
  uint32_t grid_tags_ = 0;  // not uint64_t: a cell's int64_t version store could alias it
  uint32_t grid_rubrics_ = 0;
  std::vector<Entry> sparse_;
  int shift_ = 60;
  size_t sparse_size_ = 0;
};

}  // namespace rwcore
