// The SVG of the HTML report: ULP histograms as bar charts, heatmaps with
// their colour scale, and the sweep's bound_ratio across depth.
#include "client/cli/internal/html_charts.h"

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
#include "client/cli/internal/report_format.h"
#include "core/share_format.h"

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

constexpr double kFontPx = kSvgFontPx;

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
  double label_w = 0, count_w = 0;
  for (const pb::UlpBucket& b : s.ulp_histogram()) {
    label_w = std::max(label_w, SvgTextWidth(BucketLabel(b)));
    count_w = std::max(count_w, SvgTextWidth(absl::StrCat(b.count())));
  }
  // Labels wider than a bar are turned 45 degrees; they then hang down and
  // to the left of their bar, so the margins grow with the longest one.
  // Every size comes from SvgTextWidth, an upper bound, so that no label or
  // caption reaches past the picture's edge.
  const int bar_w = std::max(44, static_cast<int>(std::ceil(count_w)) + 8);
  const bool rotate = label_w > bar_w - 4;
  // How far a turned label hangs below and left of its end: its length and
  // its height, each times cos 45 degrees.
  const double drop = rotate ? (label_w + kFontPx) * 0.7072 : 0;
  const int left = std::max(16, static_cast<int>(std::ceil(drop - bar_w / 2.0)) + 4);
  const int top = 24, plot_h = 180;
  const int label_y = top + plot_h + 14;
  const int caption_y = static_cast<int>(std::ceil(label_y + drop + kFontPx + 6));
  const std::string caption = "ULP distance (bar height: log scale)";
  const int width =
      std::max(left + n * bar_w + 16, static_cast<int>(std::ceil(SvgTextWidth(caption))) + 2 * 16);
  const int height = caption_y + 6;
  absl::StrAppend(&out, "<svg class=\"hist\" width=\"", width, "\" height=\"", height,
                  "\" viewBox=\"0 0 ", width, " ", height, "\" role=\"img\" aria-label=\"",
                  HtmlEscape(title), "\">\n");
  absl::StrAppend(&out, "<line x1=\"", left, "\" y1=\"", top + plot_h, "\" x2=\"", left + n * bar_w,
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
    const int ly = label_y;
    if (rotate) {
      absl::StrAppend(&out, "<text class=\"bucket\" x=\"", lx, "\" y=\"", ly,
                      "\" text-anchor=\"end\" transform=\"rotate(-45 ", lx, " ", ly, ")\">",
                      HtmlEscape(label), "</text>\n");
    } else {
      absl::StrAppend(&out, "<text class=\"bucket\" x=\"", lx, "\" y=\"", ly,
                      "\" text-anchor=\"middle\">", HtmlEscape(label), "</text>\n");
    }
  }
  absl::StrAppend(&out, "<text class=\"axis\" x=\"", width - 16, "\" y=\"", caption_y,
                  "\" text-anchor=\"end\">", caption, "</text>\n");
  out += "</svg>\n";
  absl::StrAppend(&out, "<p class=\"note\">", s.total(), " elements, max <span class=\"num\">",
                  HeadlineUlpCell(s), "</span> ulp, mean <span class=\"num\">", G(s.mean_ulp()),
                  "</span> ulp, bitwise-equal <span class=\"num\">",
                  FormatShare(s.bitwise_equal_count(), s.total()), "</span>.</p></figure>\n");
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
  const int bar_w = 320, left = 8, height = 58;
  // The swatches' column: after the bar when there is one.
  const double swatch_x = s.max_finite > 0 ? left + bar_w + 16 : left;
  const int width = static_cast<int>(
      std::ceil(swatch_x + 22 + SvgTextWidth("non-finite (NaN/inf mismatch)") + 8));
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
  // Room on the left for the longer row label.
  const int left =
      std::max(70, static_cast<int>(std::ceil(SvgTextWidth(absl::StrCat("row ", g.rows - 1)))) + 8);
  const int top = 22;
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
  std::string largest_text, largest_note;  // the ring's tooltip, the note's HTML
  if (largest != g.cells.end() && *largest > 0) {
    const int64_t k = largest - g.cells.begin();
    const int64_t cr = k / g.grid_cols, cc = k % g.grid_cols;
    const auto [r0, r1] = CellSourceRange(cr, g.rows, g.grid_rows);
    const auto [c0, c1] = CellSourceRange(cc, g.cols, g.grid_cols);
    auto range = [](int64_t a, int64_t b) {
      return a == b ? absl::StrCat(a) : absl::StrCat(a, "-", b);
    };
    const std::string where =
        absl::StrCat(" in rows ", range(r0, r1), ", columns ", range(c0, c1), " (ringed).");
    largest_text = absl::StrCat("Largest |difference| ", G(*largest), where);
    largest_note =
        absl::StrCat("Largest |difference| <span class=\"num\">", G(*largest), "</span>", where);
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
  absl::StrAppend(&out, ". ", largest_note, "</p></figure>\n");
  return out;
}

}  // namespace tensorcheck::cli::internal

namespace tensorcheck::cli {
namespace {

// Colours of the chart's configurations (the first eight; the rest grey).
constexpr const char* kPalette[] = {"#4f7cc9", "#2da44e", "#bf8700", "#8250df",
                                    "#1b7c83", "#d4a72c", "#e16f24", "#57606a"};

// What the chart's legend says of a bound_ratio of 0 drawn on the bottom
// line; the Python client's chart (tensorcheck._model_output) says the
// same, and places every point as this one does.
constexpr const char kZeroCaption[] = "0 (bit-exact) shown at the floor";
constexpr const char kInfCaption[] = "inf shown at the top";

}  // namespace

std::string BoundRatioSvg(const std::vector<DepthPoint>& all, size_t layers, double threshold,
                          std::optional<size_t> first_divergence) {
  std::vector<DepthPoint> points;
  std::vector<std::string> configs;  // legend order
  for (const DepthPoint& p : all) {
    if (std::isnan(p.ratio)) continue;
    if (std::find(configs.begin(), configs.end(), p.config) == configs.end()) {
      configs.push_back(p.config);
    }
    points.push_back(p);
  }
  if (points.empty()) {
    return "<p class=\"note\">No layer call has a bound_ratio to chart.</p>\n";
  }
  double lo = threshold, hi = threshold;
  bool zeros = false, infs = false;
  for (const DepthPoint& p : points) {
    if (p.ratio <= 0) {
      zeros = true;
    } else if (!std::isfinite(p.ratio)) {
      infs = true;
    } else {
      lo = std::min(lo, p.ratio);
      hi = std::max(hi, p.ratio);
    }
  }
  double ylo = std::floor(std::log10(lo)), yhi = std::ceil(std::log10(hi));
  if (yhi <= ylo) yhi = ylo + 1;
  if (zeros) ylo -= 1;  // the floor holds the zeros
  const int width = 900, height = 320, left = 64, right = 20, top = 16, bottom = 40;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const size_t n = layers;
  auto x_of = [&](size_t i) {
    return left + (n <= 1 ? plot_w / 2 : plot_w * static_cast<double>(i) / (n - 1));
  };
  auto y_of = [&](double r) {
    if (!(r > 0)) return top + plot_h;
    if (!std::isfinite(r)) return static_cast<double>(top);
    return top + plot_h * (1 - (std::log10(r) - ylo) / (yhi - ylo));
  };
  auto colour = [&](const std::string& c) {
    const size_t k =
        static_cast<size_t>(std::find(configs.begin(), configs.end(), c) - configs.begin());
    return k < 8 ? kPalette[k] : kPalette[7];
  };
  std::vector<std::pair<std::string, std::string>> legend;  // (text, swatch colour or "")
  for (const std::string& c : configs) legend.emplace_back(c, colour(c));
  if (zeros) legend.emplace_back(kZeroCaption, "");
  if (infs) legend.emplace_back(kInfCaption, "");
  const int full_height = height + 22 * static_cast<int>(legend.size());
  std::string out = absl::StrCat("<svg class=\"depth\" width=\"", width, "\" height=\"",
                                 full_height, "\" viewBox=\"0 0 ", width, " ", full_height,
                                 "\" role=\"img\" aria-label=\"bound_ratio across depth\">\n");
  absl::StrAppend(&out, "<rect x=\"", left, "\" y=\"", top, "\" width=\"", plot_w, "\" height=\"",
                  plot_h, "\" fill=\"none\" stroke=\"#d0d7de\"/>\n");
  // Every decade a grid line; at most 10 of them labelled (the floor of
  // zeros always), so that labels never overlap.
  const int decades = static_cast<int>(yhi - ylo);
  const int step = (decades + 9) / 10;
  for (int k = 0; k <= decades; ++k) {
    const double e = ylo + k;
    const double y = top + plot_h * (1 - static_cast<double>(k) / decades);
    absl::StrAppend(&out, "<line x1=\"", left, "\" x2=\"", left + plot_w, "\" y1=\"", y, "\" y2=\"",
                    y, "\" stroke=\"#eaeef2\"/>");
    if (k % step == 0 || (zeros && k == 0)) {
      absl::StrAppend(&out, "<text class=\"tick\" x=\"", left - 6, "\" y=\"", y + 4,
                      "\" text-anchor=\"end\">",
                      zeros && k == 0 ? "0" : internal::G3(std::pow(10.0, e)), "</text>");
    }
    out += "\n";
  }
  {
    const double y = y_of(threshold);
    absl::StrAppend(&out, "<line x1=\"", left, "\" x2=\"", left + plot_w, "\" y1=\"", y, "\" y2=\"",
                    y, "\" stroke=\"#cf222e\" stroke-dasharray=\"4 3\"/><text x=\"",
                    left + plot_w - 4, "\" y=\"", y - 4,
                    "\" text-anchor=\"end\" fill=\"#cf222e\">threshold ", internal::G3(threshold),
                    "</text>\n");
  }
  absl::StrAppend(&out, "<text x=\"", left + plot_w / 2, "\" y=\"", height - 8,
                  "\" text-anchor=\"middle\">layer call (execution order, 1 to ", n,
                  ")</text>\n<text x=\"14\" y=\"", top + plot_h / 2,
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 14 ", top + plot_h / 2,
                  ")\">bound_ratio (log)</text>\n");
  for (const DepthPoint& p : points) {
    const double x = x_of(p.index), y = y_of(p.ratio);
    const bool clamped = !(p.ratio > 0) || !std::isfinite(p.ratio);
    absl::StrAppend(&out, "<circle cx=\"", x, "\" cy=\"", y, "\" r=\"4\" fill=\"",
                    clamped ? "#fff" : colour(p.config), "\" stroke=\"", colour(p.config),
                    "\" stroke-width=\"1.5\"><title>", HtmlEscape(p.name), ": ",
                    HtmlEscape(p.config), ", bound_ratio ", internal::G3(p.ratio),
                    "</title></circle>\n");
    if (first_divergence == p.index) {
      // The label on the side of the ring with room for it, inside the
      // picture.
      const std::string label = absl::StrCat("first divergence: ", p.name);
      const bool flip = x + 12 + SvgTextWidth(label) > width - 4;
      const double ly = y - 8 < 14 ? y + 20 : y - 8;
      absl::StrAppend(&out, "<circle cx=\"", x, "\" cy=\"", y,
                      "\" r=\"9\" fill=\"none\" stroke=\"#cf222e\" stroke-width=\"2\"/><text x=\"",
                      flip ? x - 12 : x + 12, "\" y=\"", ly, "\"",
                      flip ? " text-anchor=\"end\"" : "", " fill=\"#cf222e\">", HtmlEscape(label),
                      "</text>\n");
    }
  }
  for (size_t k = 0; k < legend.size(); ++k) {
    const double y = height + 22.0 * k + 6;
    const auto& [text, swatch] = legend[k];
    absl::StrAppend(&out, "<circle cx=\"", left + 6, "\" cy=\"", y, "\" r=\"5\" fill=\"",
                    swatch.empty() ? "#fff" : swatch, "\" stroke=\"",
                    swatch.empty() ? "#57606a" : swatch, "\" stroke-width=\"1.5\"/><text x=\"",
                    left + 18, "\" y=\"", y + 4, "\">", HtmlEscape(text), "</text>\n");
  }
  out += "</svg>\n";
  return out;
}

double SvgTextWidth(absl::string_view text) {
  // Code points, not bytes: a UTF-8 continuation byte adds nothing.
  size_t chars = 0;
  for (char c : text) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return 0.64 * kSvgFontPx * static_cast<double>(chars);
}

}  // namespace tensorcheck::cli
