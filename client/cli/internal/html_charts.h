// The SVG of the HTML report (client/cli/html_report.h): ULP histograms
// as bar charts, and heatmaps of max-pooled differences (a palette PNG in
// an SVG, with a log colour scale). Internal to client/cli.
//
//   out += internal::HistogramSvg(stats, "ULP distance, observed vs cpu:fp64");
//   out += internal::HeatmapFigure(grid, "|observed vs cpu:fp64|", /*id=*/0);
//
// Pure functions; thread-safe.
#pragma once

#include <string>

#include "client/cli/html_report.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

// A number as "%.3g"; non-finite ones as "inf", "-inf", "nan".
std::string G3(double v);

// A <figure> captioned `title` holding the ULP histogram of `s` as an SVG
// bar chart, or a note when the response carries no histogram.
std::string HistogramSvg(const pb::Stats& s, const std::string& title);

// A <figure> captioned `title` holding the heatmap of `g` with its colour
// scale and the largest cell ringed. `id` names the scale's gradient, so it
// must differ between the figures of one page.
std::string HeatmapFigure(const AbsDiffGrid& g, const std::string& title, int id);

}  // namespace tensorcheck::cli::internal
