/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plot.h - grouped bar charts written as standalone SVG files (the style of the FlashAttention-2 paper's
 * benchmark figures: one group per sequence length, one bar per implementation).
 */
#ifndef FLASHATTN_BENCH_PLOT_H
#define FLASHATTN_BENCH_PLOT_H

/* One implementation: its legend name and one value per group (NaN = not measured, no bar drawn). */
typedef struct plot_series {
    const char *name;
    const double *values;
} plot_series;

/* Writes a grouped bar chart to `path`: n_groups groups labelled group_labels[g], each with one bar per
 * series (series[s].values[g]), value labels on the bars, a legend, and a y axis from 0 with round ticks.
 * title, x_label (under the group labels) and y_label may be NULL. Text is XML-escaped. Returns 0 on success,
 * -1 on an I/O error (errno kept) or invalid arguments (errno = EINVAL). */
int plot_bars_svg(const char *path, const char *title, const char *x_label, const char *y_label, int n_groups,
                  const char *const *group_labels, int n_series, const plot_series *series);

#endif /* FLASHATTN_BENCH_PLOT_H */
