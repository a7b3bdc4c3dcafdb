// The SVG of the HTML report: ULP histograms as bar charts, heatmaps with
// their colour scale.
#include "client/cli/internal/html_charts.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/internal/report_format.h"
#include "server/core/share_format.h"

namespace tensorcheck::cli::internal {
namespace {

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

std::string BucketLabel(const pb::UlpBucket& b) {
  if (b.lo() == kUlpInfinite) return "inf";
  if (b.hi() == kUlpInfinite) return absl::StrCat(b.lo(), "+");
  if (b.lo() == b.hi()) return absl::StrCat(b.lo());
  return absl::StrCat(b.lo(), "-", b.hi());
}

}  // namespace

std::string G3(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.3g", v);
}

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

namespace {

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

}  // namespace

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

}  // namespace tensorcheck::cli::internal
