#include "client/cli/html_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/share_format.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli {
namespace {

constexpr uint64_t kUlpInfinite = std::numeric_limits<uint64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Palette of the heatmap PNGs: 0 is an exact match, 1..kRampSize a log
// scale from the smallest to the largest positive difference, then the
// colour of non-finite differences.
constexpr int kRampSize = 253;
constexpr int kNonFiniteIndex = kRampSize + 1;

struct Rgb {
  int r, g, b;
};
constexpr Rgb kZeroColour = {255, 255, 255};
constexpr Rgb kNonFiniteColour = {37, 99, 235};
// Pale yellow to near-black red: "more is worse" reads without a legend,
// and the palest colour is still distinct from the white of exact matches.
constexpr std::array<std::pair<double, Rgb>, 5> kRampStops = {{
    {0.0, {255, 230, 140}},
    {0.3, {254, 170, 70}},
    {0.55, {240, 59, 32}},
    {0.8, {170, 0, 38}},
    {1.0, {50, 0, 25}},
}};

Rgb RampColour(double t) {
  t = std::clamp(t, 0.0, 1.0);
  for (size_t i = 1; i < kRampStops.size(); ++i) {
    if (t <= kRampStops[i].first) {
      const auto& [t0, c0] = kRampStops[i - 1];
      const auto& [t1, c1] = kRampStops[i];
      const double f = (t - t0) / (t1 - t0);
      auto mix = [f](int a, int b) { return static_cast<int>(std::lround(a + f * (b - a))); };
      return {mix(c0.r, c1.r), mix(c0.g, c1.g), mix(c0.b, c1.b)};
    }
  }
  return kRampStops.back().second;
}

std::string Hex(Rgb c) { return absl::StrFormat("#%02x%02x%02x", c.r, c.g, c.b); }

std::string G(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

std::string G3(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.3g", v);
}

std::string UlpText(uint64_t v) { return v == kUlpInfinite ? "inf" : absl::StrCat(v); }

std::string BucketLabel(const pb::UlpBucket& b) {
  if (b.lo() == kUlpInfinite) return "inf";
  if (b.hi() == kUlpInfinite) return absl::StrCat(b.lo(), "+");
  if (b.lo() == b.hi()) return absl::StrCat(b.lo());
  return absl::StrCat(b.lo(), "-", b.hi());
}

template <typename Repeated>
std::string IndexText(const Repeated& idx) {
  return absl::StrCat("(", absl::StrJoin(idx, ", "), ")");
}

template <typename Repeated>
std::string CodeList(const Repeated& items) {
  std::vector<std::string> parts;
  for (const std::string& s : items)
    parts.push_back(absl::StrCat("<code>", HtmlEscape(s), "</code>"));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>((v >> 24) & 0xff));
  out->push_back(static_cast<char>((v >> 16) & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
  out->push_back(static_cast<char>(v & 0xff));
}

void AppendPngChunk(std::string* out, const char type[4], absl::string_view data) {
  AppendBigEndian32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body.append(data.data(), data.size());
  out->append(body);
  AppendBigEndian32(out, Crc32(body));
}

// A returned output widened to doubles, or why it cannot be.
absl::StatusOr<std::vector<double>> OutputValues(const pb::ConfigResult& c) {
  if (!c.has_output() || c.output().source_case() != pb::Tensor::kData) {
    return absl::NotFoundError(absl::StrCat("the server returned no output for ", c.config()));
  }
  const std::optional<DType> d = DTypeFromProto(c.output().dtype());
  if (!d.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("output of ", c.config(), ": unknown dtype"));
  }
  auto t = Tensor::FromBytes(*d, {c.output().shape().begin(), c.output().shape().end()},
                             c.output().data());
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output of ", c.config(), ": ", t.status().message()));
  }
  std::vector<double> v(static_cast<size_t>(t->numel()));
  ToDouble(*t, v.data());
  return v;
}

const pb::ConfigResult* FindResult(const pb::VerifyResponse& r, const std::string& config) {
  for (const pb::ConfigResult& c : r.results()) {
    if (c.config() == config) return &c;
  }
  return nullptr;
}

// ---------------------------------------------------------------- SVG

// The ULP histogram as a bar chart. Bar heights are log(1 + count) so a
// bucket of a few elements next to one of millions stays visible; every
// bar carries its exact count.
std::string HistogramSvg(const pb::Stats& s, const std::string& title) {
  std::string out =
      absl::StrCat("<figure class=\"chart\"><figcaption>", HtmlEscape(title), "</figcaption>\n");
  if (s.ulp_histogram_size() == 0) {
    return out + "<p class=\"note\">No ULP histogram in the response.</p></figure>\n";
  }
  const int n = s.ulp_histogram_size();
  int64_t max_count = 0;
  for (const pb::UlpBucket& b : s.ulp_histogram()) max_count = std::max(max_count, b.count());
  size_t longest = 0;
  for (const pb::UlpBucket& b : s.ulp_histogram())
    longest = std::max(longest, BucketLabel(b).size());
  // Labels wider than a bar are turned 45 degrees (6 px a character).
  const bool rotate = longest > 6;
  const int bar_w = 44;
  const int left = 16, top = 24, plot_h = 180;
  const int bottom = rotate ? static_cast<int>(30 + 4.5 * static_cast<double>(longest)) : 40;
  const int width = left * 2 + n * bar_w;
  const int height = top + plot_h + bottom;
  absl::StrAppend(&out, "<svg class=\"hist\" width=\"", width, "\" height=\"", height,
                  "\" viewBox=\"0 0 ", width, " ", height, "\" role=\"img\" aria-label=\"",
                  HtmlEscape(title), "\">\n");
  absl::StrAppend(&out, "<line x1=\"", left, "\" y1=\"", top + plot_h, "\" x2=\"", width - left,
                  "\" y2=\"", top + plot_h, "\" stroke=\"#555\"/>\n");
  const double denom = std::log1p(static_cast<double>(std::max<int64_t>(max_count, 1)));
  for (int i = 0; i < n; ++i) {
    const pb::UlpBucket& b = s.ulp_histogram(i);
    const double frac = b.count() <= 0 ? 0.0 : std::log1p(static_cast<double>(b.count())) / denom;
    const double h = std::max(frac * plot_h, b.count() > 0 ? 1.0 : 0.0);
    const double x = left + i * bar_w + 4;
    const double y = top + plot_h - h;
    const std::string label = BucketLabel(b);
    absl::StrAppend(&out, "<rect class=\"bar\" x=\"", x, "\" y=\"", absl::StrFormat("%.1f", y),
                    "\" width=\"", bar_w - 8, "\" height=\"", absl::StrFormat("%.1f", h),
                    "\"><title>", HtmlEscape(label), " ulp: ", b.count(), " (",
                    FormatShare(b.count(), s.total()), ")</title></rect>\n");
    absl::StrAppend(&out, "<text class=\"count\" x=\"", x + (bar_w - 8) / 2.0, "\" y=\"",
                    absl::StrFormat("%.1f", y - 4), "\" text-anchor=\"middle\">", b.count(),
                    "</text>\n");
    const double lx = x + (bar_w - 8) / 2.0;
    const int ly = top + plot_h + 14;
    if (rotate) {
      absl::StrAppend(&out, "<text class=\"bucket\" x=\"", lx, "\" y=\"", ly,
                      "\" text-anchor=\"end\" transform=\"rotate(-45 ", lx, " ", ly, ")\">",
                      HtmlEscape(label), "</text>\n");
    } else {
      absl::StrAppend(&out, "<text class=\"bucket\" x=\"", lx, "\" y=\"", ly,
                      "\" text-anchor=\"middle\">", HtmlEscape(label), "</text>\n");
    }
  }
  absl::StrAppend(&out, "<text class=\"axis\" x=\"", width - left, "\" y=\"", height - 4,
                  "\" text-anchor=\"end\">ULP distance (bar height: log scale)</text>\n");
  out += "</svg>\n";
  absl::StrAppend(&out, "<p class=\"note\">", s.total(), " elements, max ", UlpText(s.max_ulp()),
                  " ulp, mean ", G(s.mean_ulp()), " ulp, bitwise-equal ",
                  FormatShare(s.bitwise_equal_count(), s.total()), ".</p></figure>\n");
  return out;
}

struct ColourScale {
  double min_positive = 0;  // 0 when no cell is positive and finite
  double max_finite = 0;
  bool any_non_finite = false;
};

ColourScale ScaleOf(const AbsDiffGrid& g) {
  ColourScale s;
  double lo = kInf;
  for (double v : g.cells) {
    if (std::isinf(v)) {
      s.any_non_finite = true;
    } else if (v > 0) {
      lo = std::min(lo, v);
      s.max_finite = std::max(s.max_finite, v);
    }
  }
  s.min_positive = std::isinf(lo) ? 0 : lo;
  return s;
}

uint8_t PaletteIndex(double v, const ColourScale& s) {
  if (std::isinf(v)) return kNonFiniteIndex;
  if (!(v > 0)) return 0;
  const double llo = std::log10(s.min_positive);
  const double lhi = std::log10(s.max_finite);
  const double t = lhi > llo ? (std::log10(v) - llo) / (lhi - llo) : 1.0;
  return static_cast<uint8_t>(1 + std::lround(std::clamp(t, 0.0, 1.0) * (kRampSize - 1)));
}

std::string HeatmapPalette() {
  std::string p;
  auto add = [&p](Rgb c) {
    p.push_back(static_cast<char>(c.r));
    p.push_back(static_cast<char>(c.g));
    p.push_back(static_cast<char>(c.b));
  };
  add(kZeroColour);
  for (int i = 0; i < kRampSize; ++i) add(RampColour(static_cast<double>(i) / (kRampSize - 1)));
  add(kNonFiniteColour);
  return p;
}

// The log colour scale: a gradient bar labelled with the minimum and
// maximum positive differences and the powers of ten in between, plus the
// swatches of exact matches and non-finite differences.
std::string LegendSvg(const ColourScale& s, int id) {
  const int bar_w = 320, left = 8, width = 560, height = 58;
  std::string out = absl::StrCat("<svg class=\"legend\" width=\"", width, "\" height=\"", height,
                                 "\" viewBox=\"0 0 ", width, " ", height,
                                 "\" role=\"img\" aria-label=\"colour scale\">\n");
  absl::StrAppend(&out, "<defs><linearGradient id=\"ramp", id, "\">");
  for (const auto& [t, c] : kRampStops) {
    absl::StrAppend(&out, "<stop offset=\"", t, "\" stop-color=\"", Hex(c), "\"/>");
  }
  out += "</linearGradient></defs>\n";
  int x = left;
  if (s.max_finite > 0) {
    absl::StrAppend(&out, "<rect x=\"", x, "\" y=\"4\" width=\"", bar_w,
                    "\" height=\"16\" fill=\"url(#ramp", id, ")\" stroke=\"#888\"/>\n");
    const double llo = std::log10(s.min_positive), lhi = std::log10(s.max_finite);
    auto pos = [&](double lv) {
      return lhi > llo ? x + (lv - llo) / (lhi - llo) * bar_w : x + bar_w;
    };
    // Powers of ten strictly inside the range, thinned to at most 6, on
    // the line under the bar; min and max on the line below that.
    const int e0 = static_cast<int>(std::ceil(llo)), e1 = static_cast<int>(std::floor(lhi));
    const int step = std::max(1, (e1 - e0 + 1 + 5) / 6);
    for (int e = e0; e <= e1; e += step) {
      const double px = pos(e);
      if (px - x < 12 || x + bar_w - px < 12) continue;  // the ends carry min/max
      absl::StrAppend(&out, "<line x1=\"", px, "\" y1=\"20\" x2=\"", px,
                      "\" y2=\"25\" stroke=\"#555\"/><text class=\"tick\" x=\"", px,
                      "\" y=\"35\" text-anchor=\"middle\">1e", e, "</text>\n");
    }
    absl::StrAppend(&out, "<text class=\"tick\" x=\"", x, "\" y=\"51\">min ", G3(s.min_positive),
                    "</text>\n");
    absl::StrAppend(&out, "<text class=\"tick\" x=\"", x + bar_w / 2,
                    "\" y=\"51\" text-anchor=\"middle\">|difference|, log scale</text>\n");
    absl::StrAppend(&out, "<text class=\"tick\" x=\"", x + bar_w,
                    "\" y=\"51\" text-anchor=\"end\">max ", G3(s.max_finite), "</text>\n");
    x += bar_w + 16;
  }
  absl::StrAppend(&out, "<rect x=\"", x, "\" y=\"4\" width=\"16\" height=\"16\" fill=\"",
                  Hex(kZeroColour), "\" stroke=\"#888\"/><text class=\"tick\" x=\"", x + 22,
                  "\" y=\"16\">0 (equal)</text>\n");
  if (s.any_non_finite) {
    absl::StrAppend(&out, "<rect x=\"", x, "\" y=\"28\" width=\"16\" height=\"16\" fill=\"",
                    Hex(kNonFiniteColour), "\" stroke=\"#888\"/><text class=\"tick\" x=\"", x + 22,
                    "\" y=\"40\">non-finite (NaN/inf mismatch)</text>\n");
  }
  out += "</svg>\n";
  return out;
}

std::string HeatmapFigure(const AbsDiffGrid& g, const std::string& title, int id) {
  const ColourScale scale = ScaleOf(g);
  std::string indices(static_cast<size_t>(g.grid_rows * g.grid_cols), '\0');
  for (size_t i = 0; i < g.cells.size(); ++i) {
    indices[i] = static_cast<char>(PaletteIndex(g.cells[i], scale));
  }
  const std::string png = EncodePalettePng(g.grid_cols, g.grid_rows, indices, HeatmapPalette());
  // The box keeps the matrix's aspect ratio, within [48, 640] pixels a side.
  constexpr double kBox = 640, kMinSide = 48;
  double w = kBox, h = kBox;
  if (g.rows >= g.cols) {
    w = std::max(kMinSide, kBox * static_cast<double>(g.cols) / static_cast<double>(g.rows));
  } else {
    h = std::max(kMinSide, kBox * static_cast<double>(g.rows) / static_cast<double>(g.cols));
  }
  const int left = 70, top = 22;
  const double width = left + w + 10, height = top + h + 8;
  std::string out =
      absl::StrCat("<figure class=\"heatmap\"><figcaption>", HtmlEscape(title), "</figcaption>\n");
  absl::StrAppend(&out, "<svg width=\"", width, "\" height=\"", height, "\" viewBox=\"0 0 ", width,
                  " ", height, "\" role=\"img\" aria-label=\"", HtmlEscape(title), "\">\n");
  absl::StrAppend(&out, "<image x=\"", left, "\" y=\"", top, "\" width=\"", w, "\" height=\"", h,
                  "\" preserveAspectRatio=\"none\" style=\"image-rendering:pixelated\" "
                  "href=\"data:image/png;base64,",
                  Base64(png), "\"/>\n");
  absl::StrAppend(&out, "<rect x=\"", left, "\" y=\"", top, "\" width=\"", w, "\" height=\"", h,
                  "\" fill=\"none\" stroke=\"#888\"/>\n");
  absl::StrAppend(&out, "<text class=\"tick\" x=\"", left - 4, "\" y=\"", top + 10,
                  "\" text-anchor=\"end\">row 0</text>\n");
  absl::StrAppend(&out, "<text class=\"tick\" x=\"", left - 4, "\" y=\"", top + h,
                  "\" text-anchor=\"end\">row ", g.rows - 1, "</text>\n");
  absl::StrAppend(&out, "<text class=\"tick\" x=\"", left, "\" y=\"", top - 6, "\">col 0</text>\n");
  absl::StrAppend(&out, "<text class=\"tick\" x=\"", left + w, "\" y=\"", top - 6,
                  "\" text-anchor=\"end\">col ", g.cols - 1, "</text>\n");
  // Ring the largest cell: at 512 cells in 640 px, one bad element is a
  // single pixel, visible but easy to miss.
  const auto largest = std::max_element(g.cells.begin(), g.cells.end());
  std::string largest_text;
  if (largest != g.cells.end() && *largest > 0) {
    const int64_t k = largest - g.cells.begin();
    const int64_t cr = k / g.grid_cols, cc = k % g.grid_cols;
    const auto [r0, r1] = CellSourceRange(cr, g.rows, g.grid_rows);
    const auto [c0, c1] = CellSourceRange(cc, g.cols, g.grid_cols);
    auto range = [](int64_t a, int64_t b) {
      return a == b ? absl::StrCat(a) : absl::StrCat(a, "-", b);
    };
    largest_text = absl::StrCat("Largest |difference| ", G(*largest), " in rows ", range(r0, r1),
                                ", columns ", range(c0, c1), " (ringed).");
    const double cx = left + (static_cast<double>(cc) + 0.5) * w / static_cast<double>(g.grid_cols);
    const double cy = top + (static_cast<double>(cr) + 0.5) * h / static_cast<double>(g.grid_rows);
    const double radius = std::max(7.0, 0.75 * std::max(w / static_cast<double>(g.grid_cols),
                                                        h / static_cast<double>(g.grid_rows)));
    absl::StrAppend(&out, "<circle class=\"largest\" cx=\"", absl::StrFormat("%.1f", cx),
                    "\" cy=\"", absl::StrFormat("%.1f", cy), "\" r=\"",
                    absl::StrFormat("%.1f", radius),
                    "\" fill=\"none\" stroke=\"#2563eb\" stroke-width=\"2\"><title>",
                    HtmlEscape(largest_text), "</title></circle>\n");
  }
  out += "</svg>\n";
  out += LegendSvg(scale, id);
  const int64_t per_r = (g.rows + g.grid_rows - 1) / std::max<int64_t>(g.grid_rows, 1);
  const int64_t per_c = (g.cols + g.grid_cols - 1) / std::max<int64_t>(g.grid_cols, 1);
  absl::StrAppend(&out, "<p class=\"note\">Output viewed as ", g.rows, " &times; ", g.cols,
                  " (rows: leading dimensions flattened; columns: N), shown as ", g.grid_rows,
                  " &times; ", g.grid_cols, " cells");
  if (per_r * per_c > 1) {
    absl::StrAppend(&out, ", each the maximum over up to ", per_r, " &times; ", per_c, " elements");
  }
  absl::StrAppend(&out, ". ", largest_text, "</p></figure>\n");
  return out;
}

constexpr const char kCss[] = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #1f2328; background: #fff; max-width: 1100px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 1.6em; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; }
th { background: #f6f8fa; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #e6f4ea; font-weight: 600; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; }
dl.summary dt { font-weight: 600; }
dl.summary dd { margin: 0; }
p.explanation { background: #f6f8fa; border-left: 4px solid #8c959f; padding: 8px 12px; }
.pass { color: #1a7f37; font-weight: 600; }
.fail { color: #cf222e; font-weight: 600; }
p.note { color: #57606a; font-size: 0.88em; }
figure { margin: 12px 0 24px 0; }
figcaption { font-weight: 600; margin-bottom: 6px; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; fill: #1f2328; }
rect.bar { fill: #4f7cc9; }
span.shared { color: #57606a; font-size: 0.88em; }
)";

// "yes" / "no", or a dash from a server that ran no plausibility test (it
// compared no elements and found nothing plausible).
std::string PlausibleCell(const pb::RankedCandidate& c) {
  if (c.plausible()) return "<span class=\"pass\">yes</span>";
  return c.compared_elements() > 0 ? "<span class=\"fail\">no</span>" : "&ndash;";
}

// "12 of 4096 (3.1 expected, p 0.02)": the plausibility test's evidence.
std::string DisagreementsCell(const pb::RankedCandidate& c) {
  if (c.compared_elements() == 0) return "&ndash;";
  return absl::StrCat(c.disagreements(), " of ", c.compared_elements(), " (",
                      G3(c.expected_disagreements()), " expected, p ", G3(c.plausibility_p()), ")");
}

// One histogram and heatmap pair: `actual` against `expected`.
struct Comparison {
  std::string title;
  const pb::Stats* stats = nullptr;  // histogram source, may be null
  // Heatmap operands: the observed tensor (nullptr: `actual_result`) and a
  // returned output.
  bool actual_is_observed = false;
  const pb::ConfigResult* actual_result = nullptr;
  const pb::ConfigResult* expected_result = nullptr;
};

}  // namespace

// ---------------------------------------------------------------- public

int64_t GridIndex(int64_t i, int64_t n, int64_t grid_n) {
  if (n <= 0 || i <= 0) return 0;
  if (grid_n <= std::numeric_limits<int64_t>::max() / i) return i * grid_n / n;
  // Beyond 63 bits (never for a real output): quotient and remainder parts.
  return (i / n) * grid_n +
         static_cast<int64_t>(static_cast<long double>(i % n) * static_cast<long double>(grid_n) /
                              static_cast<long double>(n));
}

std::pair<int64_t, int64_t> CellSourceRange(int64_t cell, int64_t n, int64_t grid_n) {
  // The first i with floor(i * grid_n / n) >= cell is ceil(cell * n / grid_n).
  auto first = [n, grid_n](int64_t c) { return (c * n + grid_n - 1) / grid_n; };
  return {first(cell), std::min(n, first(cell + 1)) - 1};
}

absl::StatusOr<AbsDiffGrid> MaxPoolAbsDiff(absl::Span<const double> a, absl::Span<const double> b,
                                           int64_t rows, int64_t cols, int64_t max_cells) {
  if (max_cells < 1) return absl::InvalidArgumentError("max_cells must be at least 1");
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("negative matrix size");
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  if (a.size() != n || b.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("a ", rows, " x ", cols, " matrix needs ", n,
                                                   " values; got ", a.size(), " and ", b.size()));
  }
  AbsDiffGrid g;
  g.rows = rows;
  g.cols = cols;
  g.grid_rows = std::min(rows, max_cells);
  g.grid_cols = std::min(cols, max_cells);
  g.cells.assign(static_cast<size_t>(g.grid_rows * g.grid_cols), 0.0);
  std::vector<int64_t> col_cell(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j)
    col_cell[static_cast<size_t>(j)] = GridIndex(j, cols, g.grid_cols);
  for (int64_t i = 0; i < rows; ++i) {
    double* cell_row = g.cells.data() + GridIndex(i, rows, g.grid_rows) * g.grid_cols;
    const double* pa = a.data() + i * cols;
    const double* pb = b.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const double x = pa[j], y = pb[j];
      double d;
      if (std::isnan(x) || std::isnan(y)) {
        d = std::isnan(x) && std::isnan(y) ? 0.0 : kInf;
      } else if (x == y) {
        d = 0.0;
      } else {
        d = std::fabs(x - y);  // inf when one side is infinite, or on overflow
      }
      double& c = cell_row[col_cell[static_cast<size_t>(j)]];
      if (d > c) c = d;
    }
  }
  return g;
}

std::pair<int64_t, int64_t> MatrixView(absl::Span<const int64_t> shape) {
  if (shape.empty()) return {1, 1};
  int64_t m = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
  return {m, shape.back()};
}

std::string HtmlEscape(absl::string_view s) { return MarkupEscape(s, /*escape_whitespace=*/false); }

uint32_t Crc32(absl::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (char ch : data) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t Adler32(absl::string_view data) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  // 5552 is the most bytes before b can overflow 32 bits (zlib's NMAX).
  size_t i = 0;
  while (i < data.size()) {
    const size_t end = std::min(data.size(), i + 5552);
    for (; i < end; ++i) {
      a += static_cast<unsigned char>(data[i]);
      b += a;
    }
    a %= kMod;
    b %= kMod;
  }
  return (b << 16) | a;
}

std::string ZlibStored(absl::string_view data) {
  constexpr size_t kMaxBlock = 65535;
  std::string out;
  out.reserve(data.size() + data.size() / kMaxBlock * 5 + 16);
  // CMF 0x78 (deflate, 32K window), FLG 0x01: 0x7801 is a multiple of 31.
  out.push_back(static_cast<char>(0x78));
  out.push_back(static_cast<char>(0x01));
  size_t pos = 0;
  do {
    const size_t len = std::min(kMaxBlock, data.size() - pos);
    const bool last = pos + len == data.size();
    out.push_back(static_cast<char>(last ? 1 : 0));  // BFINAL, BTYPE 00 (stored)
    const uint16_t l = static_cast<uint16_t>(len), nl = static_cast<uint16_t>(~l);
    out.push_back(static_cast<char>(l & 0xff));
    out.push_back(static_cast<char>(l >> 8));
    out.push_back(static_cast<char>(nl & 0xff));
    out.push_back(static_cast<char>(nl >> 8));
    out.append(data.data() + pos, len);
    pos += len;
  } while (pos < data.size());
  AppendBigEndian32(&out, Adler32(data));
  return out;
}

std::string EncodePalettePng(int64_t width, int64_t height, absl::string_view indices,
                             absl::string_view palette) {
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(width));
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(height));
  ihdr +=
      std::string("\x08\x03\x00\x00\x00", 5);  // 8-bit, palette, deflate, filter 0, no interlace
  AppendPngChunk(&png, "IHDR", ihdr);
  AppendPngChunk(&png, "PLTE", palette);
  std::string raw;
  raw.reserve(static_cast<size_t>(height * (width + 1)));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back('\0');  // filter: none
    raw.append(indices.data() + y * width, static_cast<size_t>(width));
  }
  AppendPngChunk(&png, "IDAT", ZlibStored(raw));
  AppendPngChunk(&png, "IEND", "");
  return png;
}

std::string Base64(absl::string_view data) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&data](size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(data[k]));
  };
  for (; i + 3 <= data.size(); i += 3) {
    const uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  if (i + 1 == data.size()) {
    const uint32_t v = byte(i) << 16;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out += "==";
  } else if (i + 2 == data.size()) {
    const uint32_t v = byte(i) << 16 | byte(i + 1) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back('=');
  }
  return out;
}

std::string FormatHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const Tensor* observed, const HtmlOptions& options) {
  const bool diagnose = ctx.command == "diagnose";
  const bool has_observed = r.has_observed_vs_reference() || observed != nullptr;
  const std::string ref_name = r.has_reference() && !r.reference().config().empty()
                                   ? r.reference().config()
                                   : "the reference";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  absl::StrAppend(&out, "<title>tensorcheck ", HtmlEscape(ctx.command), " report</title>\n");
  absl::StrAppend(&out, "<style>", kCss, "</style>\n</head>\n<body>\n");
  absl::StrAppend(&out, "<h1>tensorcheck ", HtmlEscape(ctx.command), "</h1>\n");

  // ---- summary
  out += "<h2>Summary</h2>\n<dl class=\"summary\">\n";
  std::string heat_config;  // the candidate the first heatmap compares with
  bool heat_is_best = false;
  if (diagnose) {
    const pb::Diagnosis& d = r.diagnosis();
    if (d.best().empty()) {
      out +=
          "<dt>Best</dt><dd><span class=\"fail\">none</span>: no candidate explains the "
          "output</dd>\n";
    } else {
      absl::StrAppend(&out, "<dt>Best</dt><dd><code class=\"pass\">", HtmlEscape(d.best()),
                      "</code></dd>\n");
      absl::StrAppend(&out, "<dt>Confidence</dt><dd>", absl::StrFormat("%.2f", d.confidence()),
                      "</dd>\n");
    }
    absl::StrAppend(&out, "<dt>Equivalent</dt><dd>", CodeList(d.equivalent()), "</dd>\n");
    absl::StrAppend(&out, "<dt>Tied</dt><dd>", CodeList(d.tied()), "</dd>\n");
    if (!d.framework_hint().empty()) {
      absl::StrAppend(&out, "<dt>Framework hint</dt><dd>", HtmlEscape(d.framework_hint()),
                      "</dd>\n");
    }
    if (!d.best().empty()) {
      heat_config = d.best();
      heat_is_best = true;
    } else if (d.ranking_size() > 0) {
      heat_config = d.ranking(0).config();
    }
  } else {
    const bool pass = r.verdict() == pb::VERDICT_PASS;
    absl::StrAppend(
        &out, "<dt>Verdict</dt><dd>",
        r.verdict() == pb::VERDICT_UNSPECIFIED
            ? "<span class=\"fail\">none</span>"
            : absl::StrCat("<span class=\"", pass ? "pass\">PASS" : "fail\">FAIL", "</span>"),
        "</dd>\n");
  }
  absl::StrAppend(&out, "<dt>Reference</dt><dd><code>", HtmlEscape(ref_name), "</code></dd>\n");
  if (r.output_shape_size() > 0) {
    absl::StrAppend(&out, "<dt>Output shape</dt><dd>[", absl::StrJoin(r.output_shape(), ", "),
                    "]</dd>\n");
  }
  if (r.has_observed_vs_reference()) {
    const pb::Stats& s = r.observed_vs_reference();
    absl::StrAppend(&out, "<dt>Observed vs reference</dt><dd>",
                    s.passed() ? "<span class=\"pass\">within tolerance</span>"
                               : "<span class=\"fail\">not within tolerance</span>",
                    ": mismatched ", s.mismatched(), " / ", s.total(), ", max_abs ", G(s.max_abs()),
                    ", max_ulp ", UlpText(s.max_ulp()), ", bitwise-equal ",
                    FormatShare(s.bitwise_equal_count(), s.total()), "</dd>\n");
  }
  out += "</dl>\n";
  if (diagnose && !r.diagnosis().explanation().empty()) {
    absl::StrAppend(&out, "<p class=\"explanation\">", HtmlEscape(r.diagnosis().explanation()),
                    "</p>\n");
  }

  // ---- tables
  if (diagnose) {
    const pb::Diagnosis& d = r.diagnosis();
    out += "<h2>Ranking</h2>\n";
    if (d.ranking_size() == 0) {
      out += "<p class=\"note\">No candidates were ranked.</p>\n";
    } else {
      out +=
          "<table class=\"ranking\">\n<tr><th>rank</th><th>config</th><th>plausible</th>"
          "<th>bitwise-equal</th><th>max_ulp</th><th>mean_ulp</th><th>bound_ratio</th>"
          "<th>disagreements</th><th>GEMM shared with</th><th>equivalent</th></tr>\n";
      int rank = 0;
      std::string ruled_out;
      for (const pb::RankedCandidate& c : d.ranking()) {
        ++rank;
        absl::StrAppend(
            &out, "<tr", !d.best().empty() && c.config() == d.best() ? " class=\"best\"" : "",
            "><td class=\"num\">", rank, "</td><td><code>", HtmlEscape(c.config()),
            "</code></td><td>", PlausibleCell(c), "</td><td class=\"num\">",
            FormatShare(c.bitwise_equal_fraction()), "</td><td class=\"num\">",
            UlpText(c.max_ulp()), "</td><td class=\"num\">", G(c.mean_ulp()),
            "</td><td class=\"num\">", c.has_bound_ratio() ? G(c.bound_ratio().value()) : "&ndash;",
            "</td><td class=\"num\">", DisagreementsCell(c), "</td><td>",
            c.shared_computation().empty()
                ? ""
                : absl::StrCat("<code>", HtmlEscape(c.shared_computation()), "</code>"),
            "</td><td>", c.equivalent_size() > 0 ? CodeList(c.equivalent()) : "", "</td></tr>\n");
        if (!c.ruled_out().empty()) {
          absl::StrAppend(&ruled_out, "<li>", rank, ". <code>", HtmlEscape(c.config()),
                          "</code>: ", HtmlEscape(c.ruled_out()), "</li>\n");
        }
      }
      out += "</table>\n";
      if (std::any_of(d.ranking().begin(), d.ranking().end(), [](const pb::RankedCandidate& c) {
            return !c.shared_computation().empty();
          })) {
        out +=
            "<p class=\"note\">A candidate with a shared GEMM multiplies the same operands in "
            "the same arithmetic as the one named on these inputs: that GEMM ran once, and only "
            "the candidate's own epilogue (bias, activation, output rounding) ran for it.</p>\n";
      }
      if (!ruled_out.empty()) {
        out += "<h3>Ruled out</h3>\n<ul class=\"ruled-out\">\n" + ruled_out + "</ul>\n";
      }
    }
    const pb::Localization& loc = d.localization();
    if (loc.outliers_size() > 0) {
      out +=
          "<h2>Outliers</h2>\n<p class=\"note\">Elements that disagree with the best "
          "candidate far beyond its error model.</p>\n<table>\n<tr><th>index</th>"
          "<th>observed</th><th>candidate</th><th>abs_diff</th><th>ulp</th></tr>\n";
      for (const pb::Element& e : loc.outliers()) {
        absl::StrAppend(&out, "<tr><td>", IndexText(e.index()), "</td><td class=\"num\">",
                        G(e.actual()), "</td><td class=\"num\">", G(e.expected()),
                        "</td><td class=\"num\">", G(e.abs_diff()), "</td><td class=\"num\">",
                        UlpText(e.ulp()), "</td></tr>\n");
      }
      out += "</table>\n";
    }
  }
  if (r.results_size() > 0) {
    absl::StrAppend(&out, "<h2>Configurations</h2>\n<p class=\"note\">Compared with ",
                    has_observed ? "the observed output" : HtmlEscape(ref_name), ".</p>\n");
    out +=
        "<table class=\"configs\">\n<tr><th>config</th><th>pass</th><th>mismatched</th>"
        "<th>max_abs</th><th>max_ulp</th><th>mean_ulp</th><th>bitwise-equal</th>"
        "<th>bound_ratio</th><th>elapsed</th></tr>\n";
    for (const pb::ConfigResult& c : r.results()) {
      const pb::Stats& s = has_observed && c.has_vs_observed() ? c.vs_observed() : c.vs_reference();
      absl::StrAppend(
          &out, "<tr><td><code>", HtmlEscape(c.config()), "</code></td><td>",
          s.passed() ? "yes" : "no", "</td><td class=\"num\">", s.mismatched(), " / ", s.total(),
          "</td><td class=\"num\">", G(s.max_abs()), "</td><td class=\"num\">",
          UlpText(s.max_ulp()), "</td><td class=\"num\">", G(s.mean_ulp()),
          "</td><td class=\"num\">", FormatShare(s.bitwise_equal_count(), s.total()),
          "</td><td class=\"num\">", s.has_bound_ratio() ? G(s.bound_ratio().value()) : "&ndash;",
          "</td><td class=\"num\">", absl::StrFormat("%.1f ms", c.elapsed_ms()),
          c.shared_computation().empty()
              ? ""
              : absl::StrCat("<br><span class=\"shared\">epilogue only; GEMM shared with <code>",
                             HtmlEscape(c.shared_computation()), "</code></span>"),
          "</td></tr>\n");
    }
    out += "</table>\n";
  }

  // ---- comparisons: histograms and heatmaps
  std::vector<Comparison> comparisons;
  const pb::ConfigResult* reference = r.has_reference() ? &r.reference() : nullptr;
  if (diagnose) {
    if (!heat_config.empty()) {
      Comparison c;
      c.title = absl::StrCat("observed vs ", heat_is_best ? "best" : "closest", " candidate ",
                             heat_config, heat_is_best ? "" : " (which does not explain it)");
      c.actual_result = FindResult(r, heat_config);
      c.stats = c.actual_result != nullptr && c.actual_result->has_vs_observed()
                    ? &c.actual_result->vs_observed()
                    : nullptr;
      c.actual_is_observed = true;
      c.expected_result = c.actual_result;
      comparisons.push_back(std::move(c));
    }
  }
  if (has_observed) {
    Comparison c;
    c.title = absl::StrCat("observed vs reference ", ref_name);
    c.stats = r.has_observed_vs_reference() ? &r.observed_vs_reference() : nullptr;
    c.actual_is_observed = true;
    c.expected_result = reference;
    comparisons.push_back(std::move(c));
  } else {
    for (const pb::ConfigResult& res : r.results()) {
      Comparison c;
      c.title = absl::StrCat(res.config(), " vs reference ", ref_name);
      c.stats = res.has_vs_reference() ? &res.vs_reference() : nullptr;
      c.actual_result = &res;
      c.expected_result = reference;
      comparisons.push_back(std::move(c));
    }
  }

  out += "<h2>ULP histograms</h2>\n";
  if (comparisons.empty()) out += "<p class=\"note\">Nothing was compared.</p>\n";
  for (const Comparison& c : comparisons) {
    if (c.stats == nullptr) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(c.title),
                      ": no statistics in the response.</p>\n");
      continue;
    }
    out += HistogramSvg(*c.stats, absl::StrCat("ULP distance, ", c.title));
  }

  out += "<h2>Heatmaps</h2>\n";
  std::vector<double> observed_values;
  if (observed != nullptr) {
    observed_values.resize(static_cast<size_t>(observed->numel()));
    ToDouble(*observed, observed_values.data());
  }
  std::vector<int64_t> shape(r.output_shape().begin(), r.output_shape().end());
  if (shape.empty() && observed != nullptr) shape = observed->shape();
  const auto [rows, cols] = MatrixView(shape);
  int shown = 0;
  for (const Comparison& c : comparisons) {
    const std::string title = absl::StrCat("|", c.title, "|");
    if (shown >= options.max_heatmaps) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(title), ": left out (at most ",
                      options.max_heatmaps, " heatmaps per page).</p>\n");
      continue;
    }
    std::string why;
    std::vector<double> actual_buffer;
    const std::vector<double>* actual = nullptr;
    if (c.actual_is_observed) {
      if (observed == nullptr) why = "the observed output is not available";
      actual = &observed_values;
    } else if (c.actual_result == nullptr) {
      why = "no result for this configuration";
    } else {
      auto v = OutputValues(*c.actual_result);
      if (v.ok()) {
        actual_buffer = *std::move(v);
        actual = &actual_buffer;
      } else {
        why = std::string(v.status().message());
      }
    }
    std::vector<double> expected;
    if (why.empty()) {
      if (c.expected_result == nullptr) {
        why = "no output to compare with";
      } else {
        auto v = OutputValues(*c.expected_result);
        if (v.ok()) {
          expected = *std::move(v);
        } else {
          why = std::string(v.status().message());
        }
      }
    }
    absl::StatusOr<AbsDiffGrid> grid = absl::InternalError("unset");
    if (why.empty()) {
      grid = MaxPoolAbsDiff(*actual, expected, rows, cols, options.max_heatmap_cells);
      if (!grid.ok()) why = std::string(grid.status().message());
    }
    if (!why.empty()) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(title), ": no heatmap (",
                      HtmlEscape(why), ").</p>\n");
      continue;
    }
    out += HeatmapFigure(*grid, title, shown);
    ++shown;
  }

  if (r.notes_size() > 0) {
    out += "<h2>Notes</h2>\n<ul>\n";
    for (const std::string& n : r.notes()) absl::StrAppend(&out, "<li>", HtmlEscape(n), "</li>\n");
    out += "</ul>\n";
  }
  out += "<p class=\"note\">Written by the tensorcheck CLI; this page is self-contained.</p>\n";
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace tensorcheck::cli
