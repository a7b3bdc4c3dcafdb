// The HTML report of a Verify/Diagnose response (`--html FILE`):
// one self-contained page, readable offline and without JavaScript.
//
//   HtmlOptions opts;
//   std::string page = FormatHtml(response, ReportContext{"diagnose"},
//                                 &observed, opts);
//
// The page opens with the server's answer: the diagnosis' headline and,
// under it, its advice (from an older server, the verdict and its reason).
// Then the summary (diagnose: best, equivalent, tied, confidence,
// framework hint, explanation; verify: verdict, acceptance and reference),
// the ranking or configuration table, ULP histograms as inline SVG bar
// charts, and heatmaps of |observed - best candidate| and |observed -
// reference| over the output viewed as a matrix [rows = product of leading
// dims, cols = N]. The layout is fluid (up to 1800 px), numbers never break
// across lines, and every chart sizes its margins to hold its text.
//
// Heatmaps are max-pooled to at most 512 x 512 cells, so a single bad
// element stays visible, and embedded as palette PNG `data:` URIs written by
// a minimal encoder here (stored deflate blocks, CRC-32, Adler-32): an SVG
// rect per cell would be tens of megabytes for a 1921 x 3072 output, the
// PNG is about 350 kB of base64. The page references nothing outside itself
// (no fonts, scripts, stylesheets or images); inline SVG needs no xmlns in
// HTML, so not even the SVG namespace URL appears.
//
// Every function here is pure: no I/O, no server, so all of it is tested
// with hand-built responses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/cli/report.h"
#include "core/tensor.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli {

struct HtmlOptions {
  // Heatmap cells per side at most.
  int64_t max_heatmap_cells = 512;
  // Heatmaps beyond this many (verify with many configurations) are left
  // out with a note, which bounds the page size.
  int max_heatmaps = 8;
  // The id of the first heatmap's colour scale: a page holding several
  // sections (FormatHtmlSection) gives each its own range.
  int first_heatmap_id = 0;
};

// A matrix of absolute differences max-pooled into a coarser grid.
struct AbsDiffGrid {
  // The source matrix.
  int64_t rows = 0;
  int64_t cols = 0;
  // The grid: min(rows, max_cells) x min(cols, max_cells).
  int64_t grid_rows = 0;
  int64_t grid_cols = 0;
  // grid_rows * grid_cols maxima, row-major. A cell holding a pair where
  // exactly one side is NaN, or where the values differ and one is
  // infinite, is +inf ("non-finite"); NaN against NaN and equal infinities
  // count as 0.
  std::vector<double> cells;
};

// Source row `i` of `rows` lands in grid row floor(i * grid_rows / rows);
// the same for columns. Cells therefore cover ceil or floor of
// rows / grid_rows source rows each, spread evenly.
int64_t GridIndex(int64_t i, int64_t n, int64_t grid_n);

// The inverse: the first and last source index (inclusive) of grid cell
// `cell`.
std::pair<int64_t, int64_t> CellSourceRange(int64_t cell, int64_t n, int64_t grid_n);

// Max-pools |a - b| of two row-major [rows, cols] matrices into at most
// max_cells x max_cells cells. INVALID_ARGUMENT when the sizes disagree or
// max_cells < 1.
absl::StatusOr<AbsDiffGrid> MaxPoolAbsDiff(absl::Span<const double> a, absl::Span<const double> b,
                                           int64_t rows, int64_t cols, int64_t max_cells);

// The matrix view of an output shape [..., N]: {product of leading dims, N}.
// A rank-0 shape is {1, 1}; a rank-1 shape [N] is {1, N}.
std::pair<int64_t, int64_t> MatrixView(absl::Span<const int64_t> shape);

// Text and attribute escaping: & < > " ' (control characters other than
// tab and newline become U+FFFD).
std::string HtmlEscape(absl::string_view s);

// CRC-32 (ISO-HDLC, as PNG uses) and Adler-32 (as zlib uses).
uint32_t Crc32(absl::string_view data);
uint32_t Adler32(absl::string_view data);

// A zlib stream of `data` in stored (uncompressed) deflate blocks.
std::string ZlibStored(absl::string_view data);

// An 8-bit palette PNG: `indices` holds width * height palette indices,
// row-major; `palette` holds up to 256 RGB triples (3 bytes each).
std::string EncodePalettePng(int64_t width, int64_t height, absl::string_view indices,
                             absl::string_view palette);

// Standard base64 with padding.
std::string Base64(absl::string_view data);

// The page. `observed` is the observed output as sent (nullptr when there
// was none); heatmaps need it and the outputs the server returned
// (`output.return_outputs`), and are replaced by a note when either is
// missing or their shapes disagree.
std::string FormatHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const Tensor* observed, const HtmlOptions& options = {});

// The page's content without the page around it (no <html>, <head>, <h1>):
// summary, tables, histograms, heatmaps, notes, its headings <h2>. For a
// page that holds several reports (`tensorcheck sweep --html`), which also
// needs HtmlStyleSheet() and distinct HtmlOptions::first_heatmap_id.
std::string FormatHtmlSection(const pb::VerifyResponse& r, const ReportContext& ctx,
                              const Tensor* observed, const HtmlOptions& options = {});

// The candidate whose output the first heatmap of a diagnosis compares
// with the observed output: the best, else the top of the ranking (which
// explains nothing); empty when the ranking is empty.
std::string HeatmapCandidate(const pb::VerifyResponse& r);

// Clears every returned output that FormatHtmlSection does not draw, so
// that a response kept for a later page (`tensorcheck sweep --html`, whose
// JSON report carries the responses) holds only those: with an observed
// output (`has_observed`, or the response's observed_vs_reference), the
// reference's and, for `diagnose`, the HeatmapCandidate's; without one,
// every output (each configuration is drawn against the reference).
void KeepDrawnOutputs(pb::VerifyResponse* r, const ReportContext& ctx, bool has_observed);

// One layer call on the chart of bound_ratio across depth.
struct DepthPoint {
  // Its place in execution order, from 0.
  size_t index = 0;
  // Its bound_ratio: 0, positive, or +inf (NaN is not charted).
  double ratio = 0;
  // The configuration explaining it, which picks its colour.
  std::string config;
  // The layer call's name.
  std::string name;
};

// bound_ratio across depth as an SVG (`tensorcheck sweep --html`; the
// Python client's ModelReport.to_html draws the same picture): x the layer
// call's index of `layers`, y log10(bound_ratio) over whole decades around
// the finite positive ratios and `threshold` (dashed). A ratio of 0 (the
// output bitwise the reference's) sits on an extra decade at the bottom,
// labelled 0, an infinite one on the top line, both hollow, and the legend
// says so ("0 (bit-exact) shown at the floor"). The first divergence, when
// it is charted, is ringed and named. A note instead when no point is
// charted.
std::string BoundRatioSvg(const std::vector<DepthPoint>& points, size_t layers, double threshold,
                          std::optional<size_t> first_divergence);

// The CSS of the pages (without the <style> element).
std::string HtmlStyleSheet();

// The font size of the charts' text, in CSS pixels (the style sheet's
// `svg text`).
inline constexpr double kSvgFontPx = 11;

// An upper bound on the width of `text` in the charts' font, in CSS pixels:
// 0.64 em a character, a digit of DejaVu Sans (Chromium's system-ui on
// Debian), wider than the digits and most letters of other sans-serif
// faces. The charts size their margins with it so that no label reaches
// past the picture's edge.
double SvgTextWidth(absl::string_view text);

}  // namespace tensorcheck::cli
