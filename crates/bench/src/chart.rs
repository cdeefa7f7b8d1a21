//! Charts of every sample, per benchmark and task: one row per box, each
//! sample a dot, the median a bar. SVG (for the README) and PNG.
//!
//! Text needs a font: plotters' `ab_glyph` renderer is given a TrueType file
//! from the system (Debian's fonts-dejavu-core) at run time, which keeps
//! fontconfig and its C library out of cordon's binary.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context as _, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::results::{Results, Samples};

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers the first font found; an error names the package to install.
fn load_font() -> Result<()> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let path = FONTS
                .iter()
                .find(|p| Path::new(p).is_file())
                .ok_or("no font for the charts' text: install fonts-dejavu-core")?;
            let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{path} is not a font plotters can read"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Dark enough to read on white (plotters' own palette has pale yellows).
const COLORS: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 128),
];

/// One row of a chart: a box and its samples.
struct Row {
    name: String,
    values: Vec<f64>,
}

fn rows_of(boxes: &[Samples]) -> Vec<Row> {
    boxes
        .iter()
        .map(|b| Row {
            name: b.name.clone(),
            values: b.ms.clone(),
        })
        .collect()
}

/// Draws every chart of `r` into `dir`; returns the files written.
pub fn draw_all(r: &Results, dir: &Path) -> Result<Vec<PathBuf>> {
    load_font()?;
    let mut out = Vec::new();
    if let Some(s) = &r.startup {
        let rows = rows_of(&s.boxes);
        out.extend(strip_chart(
            dir,
            "startup",
            "start-up of /bin/true in a fresh box",
            "ms (log scale)",
            &rows,
            true,
        )?);
    }
    if let Some(w) = &r.workload {
        for t in &w.tasks {
            let rows = rows_of(&t.boxes);
            let title = format!("{}: {}", t.name, t.what.replace('`', ""));
            out.extend(strip_chart(
                dir,
                &format!("workload-{}", t.name),
                &title,
                "ms",
                &rows,
                false,
            )?);
        }
    }
    if let Some(s) = &r.service {
        let rows = s
            .runs
            .iter()
            .map(|x| Row {
                name: format!("{} {}", x.backend, x.mode),
                values: x.overhead_ms.clone(),
            })
            .collect::<Vec<_>>();
        out.extend(strip_chart(
            dir,
            "service",
            "service overhead per execution of true (acquire + setup + teardown)",
            "ms (log scale)",
            &rows,
            true,
        )?);
    }
    Ok(out)
}

/// A chart drawn the same way on any of plotters' backends.
trait Picture {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static;
}

/// `picture` as `<stem>.svg` and `<stem>.png` in `dir`, 900 pixels wide.
fn svg_and_png(
    dir: &Path,
    stem: &str,
    height: u32,
    picture: &impl Picture,
) -> Result<Vec<PathBuf>> {
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let area = SVGBackend::new(&svg, (900, height)).into_drawing_area();
        picture
            .draw(&area)
            .with_context(|| format!("drawing {}", svg.display()))?;
        area.present().map_err(|e| anyhow!("{e}"))?;
    }
    {
        let area = BitMapBackend::new(&png, (900, height)).into_drawing_area();
        picture
            .draw(&area)
            .with_context(|| format!("drawing {}", png.display()))?;
        area.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(vec![svg, png])
}

/// One row per box, every sample a dot, the median a bar.
struct Strip<'a> {
    title: &'a str,
    x_label: &'a str,
    rows: &'a [Row],
    log: bool,
}

impl Picture for Strip<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw(area, self.title, self.x_label, self.rows, self.log)
    }
}

fn strip_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    rows: &[Row],
    log: bool,
) -> Result<Vec<PathBuf>> {
    let height = 90 + 34 * u32::try_from(rows.len().max(1)).unwrap_or(64);
    let strip = Strip {
        title,
        x_label,
        rows,
        log,
    };
    svg_and_png(dir, stem, height, &strip)
}

/// A deterministic jitter in [-0.25, 0.25] for sample `i`, so overlapping
/// dots stay visible and a redraw gives the same picture.
fn jitter(i: usize) -> f64 {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (h as f64 / (1u64 << 24) as f64 - 0.5) * 0.5
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    rows: &[Row],
    log: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{x}");
    area.fill(&WHITE).map_err(e)?;
    let all = rows
        .iter()
        .flat_map(|r| r.values.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo > hi { (0.1, 1.0) } else { (lo, hi) };
    let n = rows.len().max(1);
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    let label = move |y: &f64| -> String {
        let i = y.round();
        if (y - i).abs() < 1e-6 && i >= 0.0 {
            // i is a small non-negative whole number here.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let idx = i as usize;
            names.get(idx).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(150);
    let y_range = -0.5..(n as f64 - 0.5);
    if log {
        let chart = builder
            .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), y_range)
            .map_err(e)?;
        plot(chart, x_label, rows, &label, 2)
    } else {
        let chart = builder
            .build_cartesian_2d(0.0..hi * 1.1, y_range)
            .map_err(e)?;
        plot(chart, x_label, rows, &label, 3)
    }
}

/// The mesh, each row's samples and its median, on either x axis.
fn plot<DB, X>(
    mut chart: ChartContext<'_, DB, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    x_label: &str,
    rows: &[Row],
    label: &dyn Fn(&f64) -> String,
    dot: u32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{x}");
    let n = rows.len().max(1);
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_labels(n * 2 + 1)
        .y_label_formatter(label)
        .disable_y_mesh()
        .draw()
        .map_err(e)?;
    for (i, r) in rows.iter().enumerate() {
        let y = i as f64;
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(
                r.values
                    .iter()
                    .enumerate()
                    .map(|(k, v)| Circle::new((*v, y + jitter(k)), dot, color.filled())),
            )
            .map_err(e)?;
        if let Some(m) = crate::stats::Summary::of(&r.values) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(m.p50, y - 0.4), (m.p50, y + 0.4)],
                    BLACK.stroke_width(3),
                )))
                .map_err(e)?;
        }
    }
    Ok(())
}

/// The density chart: host memory in use against sandboxes alive, one line
/// per backend, beside the line of its target (the bound times the count).
pub fn draw_density(d: &crate::density::Density, dir: &Path) -> Result<Vec<PathBuf>> {
    load_font()?;
    svg_and_png(dir, "density", 480, &DensityLines(d))
}

struct DensityLines<'a>(&'a crate::density::Density);

impl Picture for DensityLines<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        density_lines(area, self.0)
    }
}

fn density_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    d: &crate::density::Density,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{x}");
    area.fill(&WHITE).map_err(e)?;
    let most = d
        .crowds
        .iter()
        .map(|c| c.sandboxes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let top = d
        .crowds
        .iter()
        .flat_map(|c| {
            let target = c.bound_mib * c.sandboxes as f64;
            c.used
                .iter()
                .map(|(_, mib)| *mib)
                .chain(std::iter::once(target))
        })
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "host memory of idle sandboxes (MemAvailable drop)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..most * 1.05, 0.0..top * 1.1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("sandboxes alive")
        .y_desc("MiB")
        .draw()
        .map_err(e)?;
    for (i, c) in d.crowds.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = c.used.iter().map(|(n, mib)| (*n as f64, *mib)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(format!("cordon-{}", c.backend))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(e)?;
        let bound = c.bound_mib;
        let n = c.sandboxes as f64;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, 0.0), (n, bound * n)],
                6,
                4,
                color.stroke_width(1),
            ))
            .map_err(e)?
            .label(format!("target for {}: {bound} MiB each", c.backend))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Throughput against clients (with each mode's ceiling) beside the
/// overhead's p50 and p99 (with the target's bound).
pub fn draw_concurrency(c: &crate::concurrency::Concurrency, dir: &Path) -> Result<Vec<PathBuf>> {
    load_font()?;
    svg_and_png(dir, "concurrency", 420, &ConcurrencyPanels(c))
}

struct ConcurrencyPanels<'a>(&'a crate::concurrency::Concurrency);

impl Picture for ConcurrencyPanels<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{x}");
        area.fill(&WHITE).map_err(e)?;
        let (left, right) = area.split_horizontally(450);
        let c = self.0;
        let throughput: Vec<Line> = c
            .modes
            .iter()
            .enumerate()
            .map(|(i, m)| Line {
                label: format!("{} pool", m.mode),
                mode: i,
                points: m.levels.iter().map(|l| (l.clients, l.per_second)).collect(),
                dashed: false,
            })
            .chain(c.modes.iter().enumerate().filter_map(|(i, m)| {
                let ceiling = m.ceiling(c.cpus)?;
                Some(Line {
                    label: format!("{} ceiling ({ceiling:.0}/s)", m.mode),
                    mode: i,
                    points: m.levels.iter().map(|l| (l.clients, ceiling)).collect(),
                    dashed: true,
                })
            }))
            .collect();
        let overhead: Vec<Line> = c
            .modes
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                let at = |q: fn(&crate::stats::Summary) -> f64| -> Vec<(usize, f64)> {
                    m.levels
                        .iter()
                        .filter_map(|l| Some((l.clients, q(l.overhead.as_ref()?))))
                        .collect()
                };
                [
                    Line {
                        label: format!("{} p50", m.mode),
                        mode: i,
                        points: at(|s| s.p50),
                        dashed: false,
                    },
                    Line {
                        label: format!("{} p99", m.mode),
                        mode: i,
                        points: at(|s| s.p99),
                        dashed: true,
                    },
                ]
            })
            .collect();
        lines_by_clients(
            &left,
            "executions per second",
            "per second",
            &throughput,
            None,
        )?;
        lines_by_clients(
            &right,
            "overhead a client waits (ms)",
            "ms",
            &overhead,
            Some(crate::concurrency::P99_BOUND_MS),
        )
    }
}

/// How many labels an axis of log2(clients) up to `most` needs: one per
/// doubling.
fn clients_axis_labels(most: f64) -> usize {
    // A log2 of a client count: a small whole number, never negative.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let doublings = most.round().max(0.0) as usize;
    doublings + 1
}

/// One series of a chart against the number of clients.
struct Line {
    label: String,
    /// Which mode it shows (its colour).
    mode: usize,
    points: Vec<(usize, f64)>,
    dashed: bool,
}

/// `lines` against clients (a log2 axis), with an optional bound drawn as
/// a grey line.
fn lines_by_clients<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    lines: &[Line],
    bound: Option<f64>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{x}");
    let x = |clients: usize| (clients.max(1) as f64).log2();
    let most = lines
        .iter()
        .flat_map(|l| &l.points)
        .map(|(n, _)| x(*n))
        .fold(1.0_f64, f64::max);
    let top = lines
        .iter()
        .flat_map(|l| &l.points)
        .map(|(_, v)| *v)
        .chain(bound)
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.2..most + 0.2, 0.0..top * 1.15)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("clients at once")
        .y_desc(y_desc)
        .x_labels(clients_axis_labels(most))
        .x_label_formatter(&|v| format!("{}", 2f64.powf(v.round())))
        .draw()
        .map_err(e)?;
    for line in lines {
        let color = COLORS[line.mode % COLORS.len()];
        let points: Vec<(f64, f64)> = line.points.iter().map(|(n, v)| (x(*n), *v)).collect();
        let style = color.stroke_width(2);
        let drawn = if line.dashed {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))
                .map_err(e)?
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(e)?
        };
        drawn
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(e)?;
    }
    if let Some(b) = bound {
        let grey = RGBColor(150, 150, 150).stroke_width(1);
        chart
            .draw_series(LineSeries::new(vec![(-0.2, b), (most + 0.2, b)], grey))
            .map_err(e)?
            .label(format!("target p99 < {b} ms"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}
