//! `render_chart(dataRef, x, y, kind, …)`: a chart of a stored table for the person; the
//! model gets the file paths and how many points were drawn.

use async_trait::async_trait;
use dataref_chart::{ChartError, ChartKind, ChartSpec, SortOrder};
use dataref_protocol::{DataRef, ToolSpec};
use dataref_tool::TypedTool;
use dataref_tool::{Attachment, RunContext, ToolError, ToolOutput};
use dataref_workspace::Overwrite;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::files::{file_name, file_stem, file_uri};
use crate::replay::{Replay, one_line, py_str, safe_relative, tick};
use crate::support::{blocking, output, spec_for};
use serde_json::Value;
use std::fmt::Write as _;

/// Where charts are written in the caller's workspace.
pub const CHARTS_DIR: &str = "charts";

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Bar,
    Line,
    Area,
    Scatter,
    Histogram,
    Pie,
}

impl From<Kind> for ChartKind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Bar => Self::Bar,
            Kind::Line => Self::Line,
            Kind::Area => Self::Area,
            Kind::Scatter => Self::Scatter,
            Kind::Histogram => Self::Histogram,
            Kind::Pie => Self::Pie,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Sort {
    /// By `x` itself (numbers and dates ascending, text alphabetically).
    X,
    /// Smallest total first.
    Ascending,
    /// Largest total first.
    Descending,
}

impl From<Sort> for SortOrder {
    fn from(s: Sort) -> Self {
        match s {
            Sort::X => Self::X,
            Sort::Ascending => Self::Ascending,
            Sort::Descending => Self::Descending,
        }
    }
}

/// Arguments of `render_chart`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartArgs {
    /// The table to draw.
    data_ref: DataRef,
    /// The column on the horizontal axis (for a histogram: the values to bin).
    x: String,
    /// Numeric column(s), summed per `x`; leave out to count rows.
    #[serde(default, deserialize_with = "one_or_many")]
    #[schemars(with = "OneOrMany")]
    y: Vec<String>,
    kind: Kind,
    /// A column splitting each `y` into one series per value.
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    sort: Option<Sort>,
    /// Categories kept; the rest are summed into `other`.
    #[serde(default)]
    #[schemars(range(min = 1, max = 200))]
    top: Option<u32>,
    #[serde(default)]
    #[schemars(range(min = 200, max = 4000))]
    width: Option<u32>,
    #[serde(default)]
    #[schemars(range(min = 200, max = 4000))]
    height: Option<u32>,
}

impl ChartArgs {
    /// The table drawn.
    pub(crate) fn data_ref(&self) -> &DataRef {
        &self.data_ref
    }

    /// What to draw, the defaults filled in.
    pub(crate) fn chart_spec(&self) -> ChartSpec {
        let mut spec = ChartSpec::new(self.kind.into(), self.x.clone(), self.y.clone());
        spec.group.clone_from(&self.group);
        spec.title.clone_from(&self.title);
        spec.sort = self.sort.map(Into::into);
        spec.top = self.top.map(|t| t as usize);
        spec.width = self.width.unwrap_or(ChartSpec::DEFAULT_SIZE.0);
        spec.height = self.height.unwrap_or(ChartSpec::DEFAULT_SIZE.1);
        spec
    }
}

/// The schema of `y`: a column name or a list of them (`y="delta"` as much as
/// `y=["delta"]`, since models write both).
#[derive(JsonSchema)]
#[serde(untagged)]
#[expect(dead_code, reason = "only its schema is used")]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `y` as a string or a list of strings, with an error that names both shapes.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a column name or a list of column names, e.g. \"revenue\" or [\"revenue\", \"cost\"]")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(vec![v.to_owned()])
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(c) = seq.next_element::<String>()? {
                out.push(c);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

#[derive(Debug, Serialize, JsonSchema)]
struct ChartResult {
    /// The PNG, relative to your workspace (linked for the person; the same chart as SVG
    /// is beside it, `.svg` for `.png`).
    path: String,
    /// Marks drawn (bars, slices, line vertices, dots) after folding and downsampling.
    points: u64,
}

pub struct RenderChartTool {
    spec: ToolSpec,
}

impl RenderChartTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<ChartArgs, ChartResult>(
                "render_chart",
                "Draw a chart of a stored table for the person (PNG linked, SVG beside it under \
                 `charts/`). The rows never pass through you: you get the PNG's path and the \
                 point count. Many categories fold into the top N plus `other`; long series \
                 are downsampled. For a different table, aggregate first (SQL or `run_python`).",
                false,
                false,
            )
            .with_view(dataref_protocol::VIEW_URI),
        }
    }
}

#[async_trait]
impl TypedTool for RenderChartTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = ChartArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ChartArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let workspace = ctx.workspace.clone();
        let inline_image = ctx.limits.inline_chart_image;
        // The file name depends on every argument, so a variant never replaces another.
        let key = serde_json::to_string(&a).unwrap_or_default();
        let (result, png) = blocking("render_chart", move || {
            let table = store.open_table(&owner, &a.data_ref)?;
            let spec = a.chart_spec();
            let chart = dataref_chart::render(&table.meta.schema, &table.batches, &spec)
                .map_err(chart_error)?;
            let stem = format!("{CHARTS_DIR}/{}", file_stem(&chart.title, &key));
            let png_path =
                workspace.write_atomic(&format!("{stem}.png"), &chart.png, Overwrite::Replace)?;
            workspace.write_atomic(
                &format!("{stem}.svg"),
                chart.svg.as_bytes(),
                Overwrite::Replace,
            )?;
            let result = ChartResult {
                path: png_path.as_str().to_owned(),
                points: chart.points,
            };
            Ok((result, chart.png))
        })
        .await?;
        let link = Attachment::ResourceLink {
            uri: file_uri(&result.path),
            name: file_name(&result.path),
            // `resources/read` gives the type; 20-odd bytes fewer in the model's context.
            mime_type: None,
            description: None,
        };
        let mut out = output(result)?;
        // The link is the whole content: the model reads the path in it (and the points
        // in `structuredContent`), the person's host opens it. No text block repeats the
        // JSON: MCP says a structured result SHOULD have one, but each copy is what a
        // host passing every block to the model pays for, and the link carries the path.
        out.text = Some(String::new());
        out.attachments.push(link);
        if inline_image {
            // Only when the operator asked for it (`[charts] inline_image`): ~90 KB of
            // base64 that a host may put in front of the model.
            out.attachments.push(Attachment::Image {
                data: png,
                mime_type: "image/png".into(),
            });
        }
        Ok(out)
    }
}

pub(crate) fn chart_error(e: ChartError) -> ToolError {
    match &e {
        ChartError::UnknownColumn { column, available } => ToolError::respond(
            e.to_string(),
            Some(dataref_store::did_you_mean(column, available)),
        ),
        _ if e.is_caller_error() => ToolError::respond(e.to_string(), e.hint()),
        _ => ToolError::Fatal(e.to_string()),
    }
}

impl ChartArgs {
    /// The call as a cell of a session's replay: the chart drawn again with pandas and
    /// matplotlib from the table's variable.
    pub(crate) fn replay(&self, n: usize, parsed: Option<&Value>, rp: &mut Replay<'_>) {
        let r = self.data_ref.as_str();
        let x = self.x.as_str();
        let ys = &self.y;
        let kind = self.kind.name();
        let group = self.group.as_deref();
        let title = self.title.as_deref();
        let sort = self.sort;
        let top = self.top;
        let what = if ys.is_empty() {
            "the count of rows".to_owned()
        } else {
            ys.iter().map(|y| tick(y)).collect::<Vec<_>>().join(", ")
        };
        let mut said = format!(
            "**Shown to the person** (step {n}): a {} chart of {what} by {}",
            one_line(kind),
            tick(x)
        );
        if let Some(g) = group {
            let _ = write!(said, ", one series per {}", tick(g));
        }
        match sort {
            Some(Sort::X) => said.push_str(", in the order of its x values"),
            Some(Sort::Ascending) => said.push_str(", smallest total first"),
            Some(Sort::Descending) => said.push_str(", largest total first"),
            None => {}
        }
        if let Some(top) = top {
            let _ = write!(
                said,
                ", the top {top} kept and the rest summed into `other`"
            );
        }
        if let Some(t) = title {
            let _ = write!(said, ", titled “{}”", one_line(t));
        }
        let _ = write!(said, ", drawn from {}.", rp.shown_from(r));
        rp.md(said);
        let mut code = format!(
            "# Step {n}: the chart, drawn again with pandas (dataref's renderer drew the one the\n\
             # person saw: this is close to it, not identical).\n"
        );
        let expr = match rp.table_of(r) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return rp.code(code);
            }
        };
        let _ = writeln!(code, "_table = {expr}");
        code.push_str("try:\n    import matplotlib.pyplot as plt\nexcept ImportError:\n");
        let _ = writeln!(
            code,
            "    print(\"step {n}: matplotlib is not installed, so the chart is not drawn \
             (pip install matplotlib)\")\nelse:"
        );
        let x_lit = py_str(x);
        let ys_lit = format!(
            "[{}]",
            ys.iter().map(|y| py_str(y)).collect::<Vec<_>>().join(", ")
        );
        let mut opts = String::new();
        if let Some(t) = title {
            let _ = write!(opts, ", title={}", py_str(t));
        }
        let (w, h) = (self.width, self.height);
        if w.is_some() || h.is_some() {
            let _ = write!(
                opts,
                ", figsize=({:.1}, {:.1})",
                f64::from(w.unwrap_or(ChartSpec::DEFAULT_SIZE.0)) / 100.0,
                f64::from(h.unwrap_or(ChartSpec::DEFAULT_SIZE.1)) / 100.0
            );
        }
        match self.kind {
            Kind::Histogram => {
                let _ = writeln!(code, "    _ax = _table[{x_lit}].plot(kind=\"hist\"{opts})");
            }
            Kind::Scatter if !ys.is_empty() => {
                let _ = writeln!(
                    code,
                    "    _ax = _table.plot(kind=\"scatter\", x={x_lit}, y={}{opts})",
                    py_str(&ys[0])
                );
            }
            _ => {
                match (group, ys.is_empty()) {
                    (Some(g), false) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.pivot_table(index={x_lit}, columns={}, \
                             values={ys_lit}, aggfunc=\"sum\", sort=False)",
                            py_str(g)
                        );
                    }
                    (Some(g), true) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby([{x_lit}, {}], sort=False).size()\
                             .unstack(fill_value=0)",
                            py_str(g)
                        );
                    }
                    (None, false) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby({x_lit}, sort=False)[{ys_lit}].sum()"
                        );
                    }
                    (None, true) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby({x_lit}, sort=False).size().to_frame(\"rows\")"
                        );
                    }
                }
                if let Some(top) = top {
                    let _ = writeln!(
                        code,
                        "    if len(_plot) > {top}:\n        _keep = _plot.index.isin(_plot.sum(axis=1).abs().nlargest({top}).index)\n        \
                         _plot = pd.concat([_plot[_keep], _plot[~_keep].sum().to_frame(\"other\").T])"
                    );
                }
                match sort {
                    Some(Sort::X) => code.push_str("    _plot = _plot.sort_index()\n"),
                    Some(Sort::Ascending) => code.push_str(
                        "    _plot = _plot.loc[_plot.sum(axis=1).sort_values(ascending=True).index]\n",
                    ),
                    Some(Sort::Descending) => code.push_str(
                        "    _plot = _plot.loc[_plot.sum(axis=1).sort_values(ascending=False).index]\n",
                    ),
                    None => {}
                }
                let (kind, series) = match self.kind {
                    Kind::Line => ("line", ""),
                    Kind::Area => ("area", ""),
                    Kind::Pie => ("pie", ".iloc[:, 0]"),
                    Kind::Bar | Kind::Scatter | Kind::Histogram => ("bar", ""),
                };
                let _ = writeln!(code, "    _ax = _plot{series}.plot(kind=\"{kind}\"{opts})");
            }
        }
        let file = parsed
            .and_then(|v| v.get("path"))
            .and_then(Value::as_str)
            .filter(|p| safe_relative(p))
            .map_or_else(|| format!("charts/step{n}.png"), str::to_owned);
        let _ = writeln!(
            code,
            "    os.makedirs(os.path.dirname({f}) or \".\", exist_ok=True)\n    \
             _ax.figure.savefig({f}, bbox_inches=\"tight\")\n    print(\"step {n}: drew\", {f})",
            f = py_str(&file)
        );
        rp.code(code);
    }
}

impl Kind {
    /// The kind as the model names it.
    fn name(self) -> &'static str {
        match self {
            Self::Bar => "bar",
            Self::Line => "line",
            Self::Area => "area",
            Self::Scatter => "scatter",
            Self::Histogram => "histogram",
            Self::Pie => "pie",
        }
    }
}
