// The reports for people (declared in report.h): the verify and diagnose
// text with its tables, and the server's capabilities.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/internal/report_format.h"
#include "client/cli/report.h"
#include "core/share_format.h"

namespace tensorcheck::cli {

using internal::G;
using internal::HeadlineUlpCell;
using internal::IndexText;
using internal::kDefectListed;
using internal::kRuledOutListed;
using internal::OneLine;
using internal::PlausibleText;
using internal::ReferenceName;
using internal::ToleranceText;
using internal::UlpText;
using internal::VerdictLine;

namespace {

// A plain text table with left-aligned first column.
class Table {
 public:
  // The first `left` columns are left-aligned, the others right-aligned.
  explicit Table(std::vector<std::string> header, size_t left = 1) : left_(left) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // A cell may hold several lines ('\n'): its row then takes as many, the
  // other cells staying on the first.
  std::string Render(const std::string& indent = "") const {
    std::vector<std::vector<std::vector<std::string>>> cells;  // row, column, line
    std::vector<size_t> w;
    for (const auto& r : rows_) {
      std::vector<std::vector<std::string>>& row = cells.emplace_back();
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (size_t i = 0; i < r.size(); ++i) {
        std::vector<std::string> lines = absl::StrSplit(r[i], '\n');
        for (const std::string& l : lines) w[i] = std::max(w[i], l.size());
        row.push_back(std::move(lines));
      }
    }
    std::string out;
    for (const auto& row : cells) {
      size_t height = 1;
      for (const auto& cell : row) height = std::max(height, cell.size());
      for (size_t k = 0; k < height; ++k) {
        std::string line = indent;
        for (size_t i = 0; i < row.size(); ++i) {
          const std::string text = k < row[i].size() ? row[i][k] : "";
          const std::string pad(w[i] - text.size(), ' ');
          if (i > 0) line += "  ";
          line += i < left_ ? text + pad : pad + text;
        }
        // A continuation line has nothing after its last text.
        if (k > 0) line.erase(line.find_last_not_of(' ') + 1);
        out += line + "\n";
      }
    }
    return out;
  }

 private:
  size_t left_;
  std::vector<std::vector<std::string>> rows_;
};

std::string Groups(const google::protobuf::RepeatedPtrField<pb::Group>& g) {
  std::vector<std::string> parts;
  for (const pb::Group& x : g) {
    parts.push_back(
        absl::StrCat(x.index(), " (", x.mismatched(), ", ", FormatShare(x.share()), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

// The notes under the human report's tables are wrapped at this width.
constexpr size_t kTextWidth = 100;
// Marks a configuration that reused another configuration's GEMM.
constexpr char kSharedMarker[] = "*";

// `text` word-wrapped at kTextWidth, the first line led by `first`, the
// others by `rest`; a word longer than a line stays whole.
std::string Wrap(absl::string_view text, absl::string_view first, absl::string_view rest) {
  std::string out(first);
  size_t column = first.size();
  bool empty_line = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!empty_line && column + 1 + word.size() > kTextWidth) {
      absl::StrAppend(&out, "\n", rest);
      column = rest.size();
      empty_line = true;
    }
    if (!empty_line) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    empty_line = false;
  }
  return out + "\n";
}

// One footnote line per configuration whose GEMM others reused, in order of
// first appearance: "* A, B reused the GEMM of C<suffix>". `items` are
// ConfigResults or RankedCandidates.
template <typename Items>
std::string SharedFootnotes(const Items& items, absl::string_view suffix) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& item : items) {
    if (item.shared_computation().empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == item.shared_computation(); });
    if (it == groups.end()) {
      groups.push_back({item.shared_computation(), {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(item.config());
  }
  std::string out;
  for (const auto& [shared, configs] : groups) {
    out += Wrap(absl::StrCat(absl::StrJoin(configs, ", "), " reused the GEMM of ", shared, suffix),
                absl::StrCat("  ", kSharedMarker, " "), "    ");
  }
  return out;
}

// The ranking table's config column is wrapped at this width, so that a
// row of several equivalent candidates keeps the table within kTextWidth.
constexpr size_t kConfigWidth = 34;

// The names of one ranking row, "A = B* = C", wrapped before an "=" at
// kConfigWidth (a name longer than that stays whole); a name is marked
// when its candidate reused another's GEMM.
std::string ConfigCell(const internal::RankingRow& row) {
  std::vector<std::string> names;
  for (const pb::RankedCandidate* c : row.candidates) {
    names.push_back(c->config() + (c->shared_computation().empty() ? "" : kSharedMarker));
  }
  names.insert(names.end(), row.unranked.begin(), row.unranked.end());
  std::string out = names[0];
  size_t column = out.size();
  for (size_t i = 1; i < names.size(); ++i) {
    if (column + 3 + names[i].size() > kConfigWidth) {
      absl::StrAppend(&out, "\n= ", names[i]);
      column = 2 + names[i].size();
    } else {
      absl::StrAppend(&out, " = ", names[i]);
      column += 3 + names[i].size();
    }
  }
  return out;
}

// The names of one ranking row on one line, "A = B = C".
std::string RowNames(const internal::RankingRow& row) {
  std::vector<std::string> names;
  for (const pb::RankedCandidate* c : row.candidates) names.push_back(c->config());
  names.insert(names.end(), row.unranked.begin(), row.unranked.end());
  return absl::StrJoin(names, " = ");
}

// "k=v, k=v", keys sorted: proto maps have no order.
std::string DetailsText(const google::protobuf::Map<std::string, std::string>& m) {
  std::vector<std::pair<std::string, std::string>> kv(m.begin(), m.end());
  std::sort(kv.begin(), kv.end());
  return absl::StrJoin(kv, ", ", absl::PairFormatter("="));
}

// "invariant" or "N of M rows differ (max U ULP)".
std::string InvarianceText(int64_t differing, int64_t rows, uint64_t max_ulp) {
  if (differing == 0) return "invariant";
  return absl::StrCat(differing, " of ", rows, " rows differ (max ", UlpText(max_ulp), " ULP)");
}

// One configuration's batch-invariance block: the verdict, then a line per
// sub-batch size with the kernel the backend chose for it.
std::string BatchInvarianceBlock(const std::string& name, const pb::BatchInvariance& b) {
  std::string out = absl::StrCat(
      "  ", name, ": batch invariance: ",
      b.invariant() ? "invariant" : InvarianceText(b.rows_differing(), b.rows(), b.max_ulp()),
      "\n");
  const std::string full = DetailsText(b.full_batch_details());
  if (!full.empty()) absl::StrAppend(&out, "    whole batch (", b.rows(), " rows): ", full, "\n");
  for (const pb::SubBatch& s : b.sub_batches()) {
    absl::StrAppend(&out, "    batches of ", s.batch_size(), ": ", s.runs(),
                    s.runs() == 1 ? " run" : " runs");
    if (s.tail_rows() > 0) absl::StrAppend(&out, " (last of ", s.tail_rows(), ")");
    absl::StrAppend(&out, ", ", InvarianceText(s.rows_differing(), b.rows(), s.max_ulp()));
    const std::string details = DetailsText(s.details());
    if (!details.empty()) absl::StrAppend(&out, "; ", details);
    const std::string tail = DetailsText(s.tail_details());
    if (s.tail_rows() > 0 && !tail.empty()) absl::StrAppend(&out, "; last run ", tail);
    out += "\n";
  }
  return out;
}

// The verdict's evidence (a defect): where to look, the columns and rows
// rounding of best does not explain, the elements beyond the threshold;
// the first kDefectListed of each, the JSON report has all the server sent.
std::string DefectBlock(const pb::Defect& f) {
  std::string out;
  if (!f.where_to_look().empty()) out += Wrap(f.where_to_look(), "Where to look: ", "  ");
  if (f.columns_size() + f.rows_size() > 0) {
    Table t({"not rounding", "disagreements", "expected", "p", "beyond threshold", "max_ulp",
             "max_sigma"});
    int more = 0;
    auto add = [&](const char* kind,
                   const google::protobuf::RepeatedPtrField<pb::DefectGroup>& gs) {
      for (int i = 0; i < gs.size(); ++i) {
        if (i == kDefectListed) {
          more += gs.size() - kDefectListed;
          break;
        }
        const pb::DefectGroup& g = gs[i];
        t.Add({absl::StrCat(kind, " ", g.index()), absl::StrCat(g.disagreements()),
               G(g.expected_disagreements()), G(g.p_value()), absl::StrCat(g.beyond_threshold()),
               UlpText(g.max_ulp()), G(g.max_sigma())});
      }
    };
    add("column", f.columns());
    add("row", f.rows());
    out += "\nColumns and rows not explained by rounding:\n" + t.Render("  ");
    if (more > 0) absl::StrAppend(&out, "  (", more, " more in the JSON report)\n");
  }
  if (f.element_count() > 0 || f.elements_size() > 0) {
    absl::StrAppend(&out, "Elements beyond ", G(f.element_threshold_sigma()),
                    " sigma: ", f.element_count(), " (farthest: ", UlpText(f.max_ulp()), " ulp, ",
                    G(f.max_sigma()), " sigma)\n");
    const int shown = std::min(f.elements_size(), kDefectListed);
    for (int i = 0; i < shown; ++i) {
      const pb::DefectElement& de = f.elements(i);
      const pb::Element& e = de.element();
      absl::StrAppend(&out, "  at ", IndexText(e.index()), ": observed ", G(e.actual()), ", best ",
                      G(e.expected()), " (", UlpText(e.ulp()), " ulp, ", G(de.sigma()),
                      " sigma)\n");
    }
    const int64_t more = std::max<int64_t>(f.element_count(), f.elements_size()) - shown;
    if (more > 0) absl::StrAppend(&out, "  ... ", more, " more\n");
  }
  return out;
}

}  // namespace

namespace {

// The short ranking keeps this many rows from the top, then the rows of the
// accepted configurations and of the framework defaults.
constexpr size_t kShortRankingRows = 2;

// What the diagnosis says first, in every layout: the headline (or an older
// server's verdict line), the advice, and with --accept the status word and
// the configuration accepted.
std::string DiagnosisLead(const pb::VerifyResponse& r, const pb::Diagnosis& d,
                          const ReportContext& ctx) {
  std::string out;
  const std::string headline = internal::Headline(d);
  if (!headline.empty()) out += Wrap(headline, "", "  ");
  if (!d.advice().empty()) out += Wrap(d.advice(), "Advice: ", "  ");
  if (!ctx.accept.empty()) {
    out += Wrap(internal::AcceptLine(d, ExitCodeFor(r, ctx) == 0, ctx.accept), "", "  ");
  }
  return out;
}

// The short ranking: the first kShortRankingRows rows, and the rows holding
// a candidate the server marks as accepted (--accept) or as a framework's
// default for the storage dtype (RankedCandidate.accepted,
// framework_default). Under each row one note, as the server words it:
// accepted, whose default it is, why it cannot be best.
std::string ShortRanking(const pb::Diagnosis& d) {
  const std::vector<internal::RankingRow> rows = internal::RankingRows(d);
  Table t({"rank", "config", "bitwise-equal", "bound_ratio"}, /*left=*/2);
  std::vector<std::string> notes;
  size_t shown = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<std::string> note;
    bool accepted = false;
    for (const pb::RankedCandidate* c : rows[i].candidates) {
      accepted = accepted || c->accepted() || (d.accepted() && c->config() == d.accepted_as());
      const std::string& f = c->framework_default();
      if (!f.empty() && std::find(note.begin(), note.end(), f) == note.end()) note.push_back(f);
    }
    if (i >= kShortRankingRows && !accepted && note.empty()) continue;
    if (accepted) note.insert(note.begin(), "accepted");
    const pb::RankedCandidate& c = *rows[i].candidates[0];
    if (!c.ruled_out().empty()) note.push_back("ruled out: " + OneLine(c.ruled_out()));
    t.Add({absl::StrCat(i + 1), RowNames(rows[i]), FormatShare(c.bitwise_equal_fraction()),
           c.has_bound_ratio() ? G(c.bound_ratio().value()) : "-"});
    notes.push_back(note.empty() ? "" : Wrap(absl::StrJoin(note, "; "), "        ", "          "));
    ++shown;
  }
  // The table's lines, each row followed by its note.
  const std::vector<std::string> lines = absl::StrSplit(t.Render("  "), '\n', absl::SkipEmpty());
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    out += lines[k] + "\n";
    if (k > 0 && k - 1 < notes.size()) out += notes[k - 1];
  }
  if (shown < rows.size()) {
    absl::StrAppend(&out, "  (", rows.size() - shown, " more ranked; --verbose shows every row)\n");
  }
  return out;
}

// The short diagnosis (without --verbose): the lead, the best match with its
// framework hint and confidence, where to look for a defect, the short
// ranking.
std::string ShortDiagnosis(const pb::VerifyResponse& r, const ReportContext& ctx) {
  const pb::Diagnosis& d = r.diagnosis();
  std::string out = DiagnosisLead(r, d, ctx);
  if (!out.empty()) out += "\n";
  if (d.best().empty()) {
    out += "No candidate configuration explains the observed output.\n";
  } else {
    std::string best = absl::StrCat("Best match: ", d.best(), " (confidence ",
                                    absl::StrFormat("%.2f", d.confidence()), ")");
    if (!d.framework_hint().empty()) absl::StrAppend(&best, ": ", d.framework_hint());
    out += Wrap(best, "", "  ");
  }
  if (!d.defect().where_to_look().empty()) {
    out += Wrap(d.defect().where_to_look(), "Where to look: ", "  ");
  }
  if (d.ranking_size() > 0) out += "\n" + ShortRanking(d);
  return out;
}

// The full diagnosis (--verbose): the lead, the server's verdict and what is
// not rounding, the best match, every ranking row with its shared GEMMs and
// ruled-out reasons, where differences concentrate, the tolerance's
// comparison.
std::string VerboseDiagnosis(const pb::VerifyResponse& r, const ReportContext& ctx) {
  const pb::Diagnosis& d = r.diagnosis();
  std::string out = DiagnosisLead(r, d, ctx);
  // The verdict's own line, unless the lead already is its reason (an
  // older server).
  if (!d.headline().empty()) {
    const std::string verdict = VerdictLine(d);
    if (!verdict.empty()) out += Wrap(verdict, "", "  ");
  }
  if (d.has_defect()) out += DefectBlock(d.defect());
  if (!out.empty()) out += "\n";
  if (d.best().empty()) {
    out += "No candidate configuration explains the observed output.\n";
  } else {
    absl::StrAppend(&out, "Best match: ", d.best(), " (confidence ",
                    absl::StrFormat("%.2f", d.confidence()), ")\n");
  }
  if (d.equivalent_size() > 0) {
    absl::StrAppend(&out, "Equivalent here: ", absl::StrJoin(d.equivalent(), ", "), "\n");
  }
  if (d.tied_size() > 0) {
    absl::StrAppend(&out, "Cannot be told apart from: ", absl::StrJoin(d.tied(), ", "), "\n");
  }
  if (!d.framework_hint().empty()) absl::StrAppend(&out, "Framework: ", d.framework_hint(), "\n");
  if (!d.explanation().empty()) absl::StrAppend(&out, "\n", d.explanation(), "\n");
  if (d.ranking_size() > 0) {
    // Candidates that computed the same bits share one row (their
    // statistics are identical); shared GEMMs and ruled-out reasons go
    // under the table: as columns they would push it past 100 characters.
    const std::vector<internal::RankingRow> rows = internal::RankingRows(d);
    // The exact column only when some candidate reproduced the output
    // bit for bit (a server that predates the flag sets none).
    const bool any_exact = std::any_of(d.ranking().begin(), d.ranking().end(),
                                       [](const pb::RankedCandidate& c) { return c.exact(); });
    std::vector<std::string> header = {"rank",    "config",   "plausible",  "bitwise-equal",
                                       "max_ulp", "mean_ulp", "bound_ratio"};
    if (any_exact) header.push_back("exact");
    Table t(header, /*left=*/3);
    for (size_t i = 0; i < rows.size(); ++i) {
      const pb::RankedCandidate& c = *rows[i].candidates[0];
      std::vector<std::string> row = {absl::StrCat(i + 1),
                                      ConfigCell(rows[i]),
                                      PlausibleText(c),
                                      FormatShare(c.bitwise_equal_fraction()),
                                      UlpText(c.max_ulp()),
                                      G(c.mean_ulp()),
                                      c.has_bound_ratio() ? G(c.bound_ratio().value()) : "-"};
      if (any_exact) row.push_back(c.exact() ? "yes" : "no");
      t.Add(std::move(row));
    }
    out += "\nRanking:\n" + t.Render("  ");
    out += SharedFootnotes(d.ranking(), ".");
    std::string ruled_out;
    for (size_t i = 0; i < std::min(rows.size(), static_cast<size_t>(kRuledOutListed)); ++i) {
      const pb::RankedCandidate& c = *rows[i].candidates[0];
      if (c.ruled_out().empty()) continue;
      ruled_out += Wrap(absl::StrCat(i + 1, ". ", RowNames(rows[i]), ": ", OneLine(c.ruled_out())),
                        "    ", "      ");
    }
    if (!ruled_out.empty()) out += "  Ruled out:\n" + ruled_out;
  }
  const pb::Localization& loc = d.localization();
  if (loc.columns_size() > 0)
    absl::StrAppend(&out, "\nColumns holding most differences: ", Groups(loc.columns()), "\n");
  if (loc.rows_size() > 0)
    absl::StrAppend(&out, "Rows holding most differences: ", Groups(loc.rows()), "\n");
  if (loc.outliers_size() > 0) {
    out += "Outliers (beyond the best candidate's error model):\n";
    for (const pb::Element& e : loc.outliers()) {
      absl::StrAppend(&out, "  at ", IndexText(e.index()), ": observed ", G(e.actual()),
                      ", candidate ", G(e.expected()), " (", UlpText(e.ulp()), " ulp)\n");
    }
  }
  if (r.has_observed_vs_reference()) {
    const std::string ref = ReferenceName(r);
    absl::StrAppend(&out, "\nObserved output vs ", ref, " (", ToleranceText(r.tolerance()), "):\n",
                    ClosenessMessage(r.observed_vs_reference(), r.tolerance()), "\n");
  }
  return out;
}

}  // namespace

std::string FormatHuman(const pb::VerifyResponse& r, const ReportContext& ctx) {
  std::string out;
  const std::string ref = ReferenceName(r);
  const bool observed = r.has_observed_vs_reference();
  // diagnose, and verify with --accept (which diagnoses too): the
  // diagnosis first; the tolerance's comparison only with --verbose.
  const bool diagnosis = ctx.command == "diagnose" || r.has_diagnosis();
  // Short, a diagnosis leaves out the configurations' table and the notes.
  const bool short_diagnosis = diagnosis && !ctx.verbose;
  if (short_diagnosis) {
    out += ShortDiagnosis(r, ctx);
  } else if (diagnosis) {
    out += VerboseDiagnosis(r, ctx);
  } else {
    absl::StrAppend(&out, "Verdict: ", internal::StatusWord(r.verdict() == pb::VERDICT_PASS),
                    "  (reference ", ref, ", tolerance ", ToleranceText(r.tolerance()), ")\n");
    if (observed) {
      absl::StrAppend(&out, "\nObserved output vs ", ref, ":\n",
                      ClosenessMessage(r.observed_vs_reference(), r.tolerance()), "\n");
    } else {
      for (const pb::ConfigResult& c : r.results()) {
        if (c.vs_reference().passed()) continue;
        absl::StrAppend(&out, "\n", c.config(), " vs ", ref, ":\n",
                        ClosenessMessage(c.vs_reference(), r.tolerance()), "\n");
      }
    }
  }
  if (r.results_size() > 0 && !short_diagnosis) {
    const bool any_repeat = std::any_of(r.results().begin(), r.results().end(),
                                        [](const pb::ConfigResult& c) { return c.runs() > 1; });
    // Shared GEMMs (a marker and footnotes) only with --verbose.
    const bool any_shared = ctx.verbose && std::any_of(r.results().begin(), r.results().end(),
                                                       [](const pb::ConfigResult& c) {
                                                         return !c.shared_computation().empty();
                                                       });
    std::vector<std::string> header = {"config",  "pass",          "mismatched", "max_abs",
                                       "max_ulp", "bitwise-equal", "elapsed"};
    if (any_repeat) header.push_back("deterministic");
    Table t(header);
    for (const pb::ConfigResult& c : r.results()) {
      const pb::Stats& s = observed && c.has_vs_observed() ? c.vs_observed() : c.vs_reference();
      // The marker (or a space, keeping the digits aligned) says that the
      // time is the epilogue's alone.
      std::string elapsed = absl::StrFormat("%.1f ms", c.elapsed_ms());
      if (any_shared) elapsed += c.shared_computation().empty() ? " " : kSharedMarker;
      std::vector<std::string> row = {c.config(),
                                      s.passed() ? "yes" : "no",
                                      absl::StrCat(s.mismatched(), " / ", s.total()),
                                      G(s.max_abs()),
                                      HeadlineUlpCell(s),
                                      FormatShare(s.bitwise_equal_count(), s.total()),
                                      std::move(elapsed)};
      if (any_repeat) {
        row.push_back(c.runs() > 1
                          ? absl::StrCat(c.deterministic() ? "yes" : "no", " (", c.runs(), " runs)")
                          : "-");
      }
      t.Add(std::move(row));
    }
    absl::StrAppend(&out, "\nConfigurations compared with ", observed ? "the observed output" : ref,
                    ":\n", t.Render("  "));
    if (any_shared) out += SharedFootnotes(r.results(), " (elapsed: epilogue only).");
  }
  std::string invariance;
  if (r.reference().has_batch_invariance()) {
    invariance += BatchInvarianceBlock(absl::StrCat(r.reference().config(), " (reference)"),
                                       r.reference().batch_invariance());
  }
  for (const pb::ConfigResult& c : r.results()) {
    if (c.has_batch_invariance())
      invariance += BatchInvarianceBlock(c.config(), c.batch_invariance());
  }
  if (!invariance.empty()) {
    out += "\nRows rerun in sub-batches (bits compared with the whole batch's):\n" + invariance;
  }
  if (r.notes_size() > 0 && !short_diagnosis) {
    out += "\nNotes:\n";
    for (const std::string& n : r.notes()) absl::StrAppend(&out, "  - ", n, "\n");
  }
  return out;
}

std::string FormatCompareHuman(const pb::CompareResponse& r, const ReportContext& ctx) {
  std::string out;
  if (!r.headline().empty()) out += Wrap(r.headline(), "", "  ");
  if (!out.empty()) out += "\n";
  // The acceptance column only when the request had --accept.
  const bool accept = !ctx.accept.empty();
  std::vector<std::string> header = {"output", "best match", "confidence", "verdict"};
  if (accept) header.push_back("accepted as");
  Table t(header, /*left=*/2);
  for (const pb::ComparedOutput& o : r.outputs()) {
    const pb::Diagnosis& d = o.diagnosis();
    const std::string verdict = internal::VerdictName(d.verdict());
    std::vector<std::string> row = {o.name(), d.best().empty() ? "none explains it" : d.best(),
                                    absl::StrFormat("%.2f", d.confidence()),
                                    verdict.empty() ? "-" : verdict};
    if (accept) row.push_back(d.accepted() ? d.accepted_as() : "no");
    t.Add(std::move(row));
  }
  out += t.Render("  ");
  if (r.has_pair()) {
    const pb::OutputPair& p = r.pair();
    const pb::Stats& s = p.stats();
    out += Wrap(absl::StrCat(p.a(), " vs ", p.b(), ": max_abs ", G(s.max_abs()), ", max_ulp ",
                             HeadlineUlpCell(s), ", bitwise-equal ",
                             FormatShare(s.bitwise_equal_count(), s.total()), "; rounding allows ",
                             G(p.configs_max_abs() + p.expected_max_abs()), " (configurations ",
                             G(p.configs_max_abs()), " apart, outputs ", G(p.expected_max_abs()),
                             " from them); rounding: ", p.rounding() ? "yes" : "no"),
                "  ", "    ");
  }
  if (!ctx.accept.empty()) {
    absl::StrAppend(&out, "Verdict: ", internal::StatusWord(r.verdict() == pb::VERDICT_PASS),
                    " (accept ", absl::StrJoin(ctx.accept, ", "), ")\n");
  }
  if (!ctx.verbose) return out;
  // --verbose: each output's diagnosis, short, the advice both ways, notes.
  for (const pb::ComparedOutput& o : r.outputs()) {
    pb::VerifyResponse one;
    *one.mutable_diagnosis() = o.diagnosis();
    *one.mutable_observed_vs_reference() = o.vs_reference();
    if (!ctx.accept.empty()) {
      one.set_verdict(o.diagnosis().accepted() ? pb::VERDICT_PASS : pb::VERDICT_FAIL);
    }
    ReportContext one_ctx = ctx;
    one_ctx.command = "diagnose";
    absl::StrAppend(&out, "\n== ", o.name(), " ==\n", ShortDiagnosis(one, one_ctx));
  }
  if (r.has_pair()) {
    const pb::OutputPair& p = r.pair();
    std::string advice;
    if (!p.advice_b_to_a().empty()) {
      advice += Wrap(p.advice_b_to_a(), absl::StrCat("  ", p.b(), " -> ", p.a(), ": "), "    ");
    }
    if (!p.advice_a_to_b().empty()) {
      advice += Wrap(p.advice_a_to_b(), absl::StrCat("  ", p.a(), " -> ", p.b(), ": "), "    ");
    }
    if (!advice.empty()) out += "\nWhat to change:\n" + advice;
  }
  if (!r.reference().empty()) absl::StrAppend(&out, "\nReference: ", r.reference(), "\n");
  if (r.notes_size() > 0) {
    out += "\nNotes:\n";
    for (const std::string& n : r.notes()) absl::StrAppend(&out, "  - ", n, "\n");
  }
  return out;
}

std::string FormatCapabilities(const pb::GetCapabilitiesResponse& r) {
  std::string out = absl::StrCat("tensorcheck server ", r.server_version(), "\n");
  if (!r.default_reference().empty()) {
    absl::StrAppend(&out, "Default reference: ", r.default_reference(), "\n");
  }
  if (r.tolerance_presets_size() > 0) {
    absl::StrAppend(&out, "Tolerance presets: ", absl::StrJoin(r.tolerance_presets(), ", "), "\n");
  }
  absl::StrAppend(&out, "Tensor store: ", r.tensor_store() ? "yes" : "no");
  if (r.store().present()) {
    const pb::StoreInfo& st = r.store();
    absl::StrAppend(&out, " (", st.tensor_count(), " tensors, ", st.bytes_used(), " of ",
                    st.budget_bytes(), " bytes used; ", st.uploads(), " uploads, ", st.evictions(),
                    " evictions since start)");
  }
  absl::StrAppend(&out, "\n");
  for (const pb::BackendInfo& b : r.backends()) {
    absl::StrAppend(&out, "\nBackend ", b.name(), ": ", b.available() ? "available" : "unavailable",
                    "\n");
    if (!b.available() && !b.unavailable_reason().empty()) {
      absl::StrAppend(&out, "  reason: ", b.unavailable_reason(), "\n");
    }
    if (b.has_device() && !b.device().name().empty()) {
      const pb::DeviceInfo& d = b.device();
      absl::StrAppend(&out, "  device: ", d.name(), " (sm ", d.compute_capability(), ", ",
                      d.memory_bytes() >> 20, " MiB, driver ", d.driver_version(), ", cuBLAS ",
                      d.cublas_version(), ")\n");
    }
    if (b.precisions_size() > 0) {
      absl::StrAppend(&out, "  precisions: ", absl::StrJoin(b.precisions(), ", "), "\n");
    }
    if (b.bias_modes_size() > 0) {
      absl::StrAppend(&out, "  bias modes: ", absl::StrJoin(b.bias_modes(), ", "), "\n");
    }
    if (b.configs_size() > 0) {
      absl::StrAppend(&out, "  configs: ", absl::StrJoin(b.configs(), ", "), "\n");
    }
  }
  if (r.has_limits()) {
    const pb::Limits& l = r.limits();
    absl::StrAppend(&out, "\nLimits: message ", l.max_message_bytes(), " bytes, tensor ",
                    l.max_tensor_bytes(), " bytes, configs ", l.max_configs(), ", rank ",
                    l.max_rank(), ", top_k ", l.max_top_k(), ", repeat ", l.max_repeat(), "\n");
  }
  return out;
}

}  // namespace tensorcheck::cli
