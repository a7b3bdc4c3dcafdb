// Top-k selection for Compare: the `worst` elements (WorstHeap, ranked by
// RankKey) and the columns/rows with the most mismatches (TopGroups), each
// kept as a bounded heap while the kernels run and merged in element order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "server/stats/diff_stats.h"

namespace tensorcheck::internal {

// Ranking of an element for `worst`: higher ranks first.
struct RankKey {
  int tier = 0;  // 1: NaN against a number
  double r = 0;  // abs diff, NaN pairs mapped to 0 or +inf
  uint64_t ulp = 0;
  int64_t index = 0;
};

inline bool RanksAbove(const RankKey& x, const RankKey& y) {
  if (x.tier != y.tier) return x.tier > y.tier;
  if (x.r != y.r) return x.r > y.r;
  if (x.ulp != y.ulp) return x.ulp > y.ulp;
  return x.index < y.index;
}

struct Candidate {
  RankKey key;
  ElementDiff diff;
};

// |a-e| / |e|, and at e == 0: 0 if a == e else +inf.
inline double RelDiff(double abs_diff, double abs_e) {
  if (abs_e > 0) return abs_diff / abs_e;
  return abs_diff > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

inline ElementDiff MakeDiff(int64_t i, double a, double e, uint64_t ba, uint64_t be,
                            double abs_diff, double rel, uint64_t ulp) {
  ElementDiff d;
  d.flat_index = i;
  d.actual = a;
  d.expected = e;
  d.actual_bits = ba;
  d.expected_bits = be;
  d.abs_diff = abs_diff;
  d.rel_diff = rel;
  d.ulp = ulp;
  return d;
}

// Keeps the `limit` highest-ranked candidates. The heap's front is the
// lowest ranked of them.
class WorstHeap {
 public:
  explicit WorstHeap(int limit) : limit_(static_cast<size_t>(limit)) {}

  // Cheap pre-check on the hot path: false when (tier, r) cannot enter.
  bool MayEnter(int tier, double r) const {
    if (limit_ == 0) return false;
    if (items_.size() < limit_) return true;
    const RankKey& low = items_.front().key;
    return tier > low.tier || (tier == low.tier && r >= low.r);
  }

  // Which tier-0 (no NaN) candidates can still enter, for a thread that
  // offers its elements in index order (so a later element never wins an
  // exact tie): abs diff above r, or equal to r with more ULPs.
  struct Gate {
    double r;
    uint64_t ulp;
    bool Admits(double abs_diff, uint64_t u) const {
      return abs_diff > r || (abs_diff == r && u > ulp);
    }
  };
  Gate TierZeroGate() const {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    if (limit_ == 0) return {kInf, kUlpInfinite};
    if (items_.size() < limit_) return {-kInf, 0};
    const RankKey& low = items_.front().key;
    if (low.tier > 0) return {kInf, kUlpInfinite};
    return {low.r, low.ulp};
  }

  void Offer(const Candidate& c) {
    static constexpr auto kCmp = [](const Candidate& x, const Candidate& y) {
      return RanksAbove(x.key, y.key);
    };
    if (items_.size() < limit_) {
      items_.push_back(c);
      std::push_heap(items_.begin(), items_.end(), kCmp);
      return;
    }
    if (limit_ == 0 || !RanksAbove(c.key, items_.front().key)) return;
    std::pop_heap(items_.begin(), items_.end(), kCmp);
    items_.back() = c;
    std::push_heap(items_.begin(), items_.end(), kCmp);
  }

  std::vector<Candidate>& items() { return items_; }

 private:
  size_t limit_;
  std::vector<Candidate> items_;
};

// Keeps the `limit` groups with the most mismatches (ties: lower index).
class TopGroups {
 public:
  explicit TopGroups(int limit) : limit_(static_cast<size_t>(limit)) {}

  void Offer(int64_t index, int64_t count) {
    if (count <= 0 || limit_ == 0) return;
    GroupCount g;
    g.index = index;
    g.mismatched = count;
    if (items_.size() < limit_) {
      items_.push_back(g);
      std::push_heap(items_.begin(), items_.end(), Above);
      return;
    }
    if (!Above(g, items_.front())) return;
    std::pop_heap(items_.begin(), items_.end(), Above);
    items_.back() = g;
    std::push_heap(items_.begin(), items_.end(), Above);
  }

  std::vector<GroupCount> Take(int64_t total_mismatched) {
    std::sort(items_.begin(), items_.end(), Above);
    for (GroupCount& g : items_) {
      g.share = static_cast<double>(g.mismatched) / static_cast<double>(total_mismatched);
    }
    return std::move(items_);
  }

 private:
  static bool Above(const GroupCount& x, const GroupCount& y) {
    if (x.mismatched != y.mismatched) return x.mismatched > y.mismatched;
    return x.index < y.index;
  }
  size_t limit_;
  std::vector<GroupCount> items_;
};

// Sorts `candidates` as DiffStats::worst lists them (NaN against a number
// first, then abs diff with NaN against NaN as 0 under `nan_equal` and +inf
// otherwise, ULP, lower index) and keeps the first `top_k`.
void RankWorst(std::vector<ElementDiff>& candidates, int top_k, bool nan_equal);

}  // namespace tensorcheck::internal
