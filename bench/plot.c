/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plot.c - grouped bar charts as standalone SVG (see plot.h). No dependencies: the file is written with
 * fprintf, and text widths are estimated from the font size, which is close enough for a sans-serif font.
 */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Okabe-Ito colours (distinguishable with colour blindness), most contrasting first; more series cycle. */
static const char *const palette[] = { "#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                       "#56B4E9", "#D55E00", "#F0E442", "#555555" };
#define PALETTE_SIZE ((int)(sizeof(palette) / sizeof(palette[0])))

#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"

/* Layout, in SVG user units (pixels). */
#define MARGIN_LEFT   72.0
#define MARGIN_RIGHT  24.0
#define TITLE_HEIGHT  34.0
#define LEGEND_ROW    22.0
#define PLOT_HEIGHT   320.0
#define MARGIN_BOTTOM 54.0 /* group labels, then the x-axis label */
#define MIN_WIDTH     560.0
#define VALUE_FONT    10.0
#define LABEL_FONT    12.0

static double text_width(const char *s, double font_size) {
    return 0.6 * font_size * (double)strlen(s);
}

static void put_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* Value label: integers from 10 up (as in the paper's figures), more digits below. */
static void format_value(char *buf, size_t n, double v) {
    double a = fabs(v);
    int digits = a >= 10.0 ? 0 : a >= 1.0 ? 1 : 2;
    snprintf(buf, n, "%.*f", digits, v);
}

/* A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about 5 intervals up to max. */
static double tick_step(double max) {
    double raw = max / 5.0;
    double p = pow(10.0, floor(log10(raw)));
    static const double mult[] = { 1.0, 2.0, 2.5, 5.0, 10.0 };
    for (int i = 0; i < 5; i++)
        if (raw <= mult[i] * p) return mult[i] * p;
    return 10.0 * p;
}

static void format_tick(char *buf, size_t n, double v, double step) {
    int digits = 0;
    while (digits < 6 && fabs(step * pow(10.0, digits) - round(step * pow(10.0, digits))) > 1e-9) digits++;
    snprintf(buf, n, "%.*f", digits, v);
}

int plot_bars_svg(const char *path, const char *title, const char *x_label, const char *y_label, int n_groups,
                  const char *const *group_labels, int n_series, const plot_series *series) {
    if (!path || n_groups < 0 || n_series < 0 || (n_groups > 0 && !group_labels) || (n_series > 0 && !series)) {
        errno = EINVAL;
        return -1;
    }
    for (int s = 0; s < n_series; s++)
        if (n_groups > 0 && !series[s].values) {
            errno = EINVAL;
            return -1;
        }

    double max = 0.0;
    for (int s = 0; s < n_series; s++)
        for (int g = 0; g < n_groups; g++) {
            double v = series[s].values[g];
            if (isfinite(v) && v > max) max = v;
        }
    if (max <= 0.0) max = 1.0;
    double step = tick_step(max);
    /* Head room above the tallest bar for its value label. */
    double y_max = step * ceil(max * 1.08 / step);

    double bar_w = n_series <= 4 ? 26.0 : n_series <= 6 ? 20.0 : 14.0;
    double group_gap = bar_w * 1.4;
    double group_w = (n_series > 0 ? n_series : 1) * bar_w + group_gap;
    double width = MARGIN_LEFT + (n_groups > 0 ? n_groups : 1) * group_w + MARGIN_RIGHT;
    double min_width = MIN_WIDTH;
    /* Bold 16 px title: a little wider per character than the estimate. */
    if (title && 1.1 * text_width(title, 16.0) + 40.0 > min_width) min_width = 1.1 * text_width(title, 16.0) + 40.0;
    if (width < min_width) {
        group_w += (min_width - width) / (n_groups > 0 ? n_groups : 1);
        width = min_width;
    }

    /* Legend: items laid out left to right, wrapped to the plot width. */
    double legend_x0 = MARGIN_LEFT, legend_x1 = width - MARGIN_RIGHT;
    int legend_rows = n_series > 0 ? 1 : 0;
    double x = legend_x0;
    for (int s = 0; s < n_series; s++) {
        double w = 18.0 + text_width(series[s].name ? series[s].name : "", LABEL_FONT) + 18.0;
        if (x + w > legend_x1 && x > legend_x0) {
            legend_rows++;
            x = legend_x0;
        }
        x += w;
    }

    double plot_top = TITLE_HEIGHT + legend_rows * LEGEND_ROW + 10.0;
    double plot_bottom = plot_top + PLOT_HEIGHT;
    double height = plot_bottom + MARGIN_BOTTOM;
    double plot_left = MARGIN_LEFT, plot_right = width - MARGIN_RIGHT;

    FILE *f = fopen(path, "w");
    if (!f) return -1;

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"%s\">\n",
            width, height, width, height, FONT);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    if (title) {
        fprintf(f, "<text x=\"%.1f\" y=\"22\" font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\">",
                width / 2);
        put_escaped(f, title);
        fprintf(f, "</text>\n");
    }

    x = legend_x0;
    double y = TITLE_HEIGHT;
    for (int s = 0; s < n_series; s++) {
        const char *name = series[s].name ? series[s].name : "";
        double w = 18.0 + text_width(name, LABEL_FONT) + 18.0;
        if (x + w > legend_x1 && x > legend_x0) {
            x = legend_x0;
            y += LEGEND_ROW;
        }
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"13\" height=\"13\" fill=\"%s\"/>\n", x, y + 2,
                palette[s % PALETTE_SIZE]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\">", x + 18.0, y + 13.0, LABEL_FONT);
        put_escaped(f, name);
        fprintf(f, "</text>\n");
        x += w;
    }

    /* Grid lines and y ticks. */
    double scale = PLOT_HEIGHT / y_max;
    for (int i = 0; i * step <= y_max * (1.0 + 1e-9); i++) {
        double v = i * step, ty = plot_bottom - v * scale;
        char buf[32];
        format_tick(buf, sizeof buf, v, step);
        if (i > 0)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n", plot_left, ty,
                    plot_right, ty);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", plot_left - 5, ty,
                plot_left, ty);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"end\">%s</text>\n", plot_left - 8,
                ty + 4, LABEL_FONT, buf);
    }
    if (y_label) {
        double cy = (plot_top + plot_bottom) / 2;
        fprintf(f,
                "<text x=\"18\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 18 %.1f)\">",
                cy, cy);
        put_escaped(f, y_label);
        fprintf(f, "</text>\n");
    }

    /* Bars, value labels (rotated when wider than the bar), group labels. */
    for (int g = 0; g < n_groups; g++) {
        double gx = plot_left + g * group_w + (group_w - n_series * bar_w) / 2;
        for (int s = 0; s < n_series; s++) {
            double v = series[s].values[g];
            double bx = gx + s * bar_w, cx = bx + bar_w / 2;
            if (!isfinite(v)) {
                fprintf(f,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#888888\" text-anchor=\"start\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">n/a</text>\n",
                        cx + 3, plot_bottom - 4, cx + 3, plot_bottom - 4);
                continue;
            }
            double h = (v > 0 ? v : 0) * scale;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", bx + 1,
                    plot_bottom - h, bar_w - 2, h, palette[s % PALETTE_SIZE]);
            char buf[32];
            format_value(buf, sizeof buf, v);
            double ty = plot_bottom - h - 4;
            if (text_width(buf, VALUE_FONT) <= bar_w)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"middle\">%s</text>\n", cx, ty,
                        VALUE_FONT, buf);
            else
                fprintf(f,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"start\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
                        cx + 3.5, ty, VALUE_FONT, cx + 3.5, ty, buf);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"middle\">",
                plot_left + g * group_w + group_w / 2, plot_bottom + 20, LABEL_FONT);
        put_escaped(f, group_labels[g]);
        fprintf(f, "</text>\n");
    }

    if (x_label) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">", (plot_left + plot_right) / 2,
                plot_bottom + 40);
        put_escaped(f, x_label);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", plot_left, plot_top,
            plot_left, plot_bottom);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", plot_left, plot_bottom,
            plot_right, plot_bottom);
    fprintf(f, "</svg>\n");

    int failed = ferror(f);
    int saved = errno;
    if (fclose(f) != 0) return -1;
    if (failed) {
        errno = saved ? saved : EIO;
        return -1;
    }
    return 0;
}
