//! `[spill]`: tool results over a threshold are written to the caller's workspace and the
//! model gets the path and a synopsis instead.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawSpill;
use crate::units::duration;

/// When a tool result is written to `.spill/` in the caller's workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillConfig {
    /// Spill at all. Default true.
    pub enabled: bool,
    /// A result whose text has more characters than this is spilled. Default 1000.
    pub threshold_chars: usize,
    /// Characters of the result shown to the model beside the path. Default 300.
    pub preview_chars: usize,
    /// Spill files older than this are removed. Default 7 days.
    pub retention: Duration,
    /// How often old spill files are looked for. Default 6 h.
    pub sweep_interval: Duration,
    /// Per-tool settings by tool name, over the defaults above.
    pub tools: BTreeMap<String, ToolSpill>,
}

/// `[spill.tools.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolSpill {
    /// `false` never spills this tool; `true` spills it even when its result is already a
    /// synopsis (the built-in producers'). Default: the tool's own default.
    pub enabled: Option<bool>,
    pub threshold_chars: Option<usize>,
}

impl Default for SpillConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold_chars: 1000,
            preview_chars: 300,
            retention: Duration::from_secs(7 * 24 * 3600),
            sweep_interval: Duration::from_secs(6 * 3600),
            tools: BTreeMap::new(),
        }
    }
}

impl SpillConfig {
    /// The threshold for `tool`, or `None` when its results are never spilled.
    /// `synopsis` says the tool's result is already made for the model (a dataRef with its
    /// schema, statistics): such tools spill only when the config names them.
    pub fn threshold_for(&self, tool: &str, synopsis: bool) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let own = self.tools.get(tool);
        let enabled = own.and_then(|t| t.enabled).unwrap_or(!synopsis);
        enabled.then(|| {
            own.and_then(|t| t.threshold_chars)
                .unwrap_or(self.threshold_chars)
        })
    }
}

pub(crate) fn resolve_spill(raw: &RawSpill) -> Result<SpillConfig, ConfigError> {
    let d = SpillConfig::default();
    let mut tools = BTreeMap::new();
    for (name, t) in &raw.tools {
        if t.threshold_chars == Some(0) {
            return Err(invalid(
                format!("spill.tools.{name}.threshold_chars"),
                "must be above zero",
                "write `enabled = false` to never spill this tool",
            ));
        }
        tools.insert(
            name.clone(),
            ToolSpill {
                enabled: t.enabled,
                threshold_chars: t.threshold_chars,
            },
        );
    }
    let spill = SpillConfig {
        enabled: raw.enabled.unwrap_or(d.enabled),
        threshold_chars: raw.threshold_chars.unwrap_or(d.threshold_chars),
        preview_chars: raw.preview_chars.unwrap_or(d.preview_chars),
        retention: duration("spill.retention", &raw.retention, d.retention)?,
        sweep_interval: duration(
            "spill.sweep_interval",
            &raw.sweep_interval,
            d.sweep_interval,
        )?,
        tools,
    };
    if spill.threshold_chars == 0 {
        return Err(invalid(
            "spill.threshold_chars",
            "must be above zero",
            "the default is 1000; write `enabled = false` to switch spilling off",
        ));
    }
    if spill.preview_chars > spill.threshold_chars {
        return Err(invalid(
            "spill.preview_chars",
            "must not exceed `spill.threshold_chars`",
            "the defaults are 300 and 1000",
        ));
    }
    if spill.retention.is_zero() || spill.sweep_interval.is_zero() {
        return Err(invalid(
            "spill.retention",
            "`retention` and `sweep_interval` must be longer than zero",
            "the defaults are `7d` and `6h`",
        ));
    }
    Ok(spill)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "/etc/dataref".as_ref(), "/var/lib/dataref".into())
    }

    #[test]
    fn defaults_and_per_tool_thresholds() {
        let c = parse(
            r#"
[spill]
threshold_chars = 2000
retention = "1d"
[spill.tools.fetch_sales]
enabled = true
[spill.tools.big]
threshold_chars = 50000
[spill.tools.quiet]
enabled = false
"#,
        )
        .unwrap();
        let s = &c.spill;
        assert_eq!(s.retention, Duration::from_secs(86400));
        assert_eq!(s.sweep_interval, Duration::from_secs(6 * 3600));
        assert_eq!(s.threshold_for("other", false), Some(2000));
        assert_eq!(s.threshold_for("describe_data", true), None);
        assert_eq!(s.threshold_for("fetch_sales", true), Some(2000));
        assert_eq!(s.threshold_for("big", false), Some(50000));
        assert_eq!(s.threshold_for("quiet", false), None);
        assert_eq!(SpillConfig::default().threshold_for("x", false), Some(1000));
        let off = parse("[spill]\nenabled = false\n").unwrap();
        assert_eq!(off.spill.threshold_for("x", false), None);
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key) in [
            ("[spill]\nthreshold_chars = 0\n", "spill.threshold_chars"),
            ("[spill.tools.x]\nthreshold_chars = 0\n", "spill.tools.x"),
            ("[spill]\nretention = \"soon\"\n", "spill.retention"),
            (
                "[spill]\nthreshold_chars = 100\npreview_chars = 200\n",
                "spill.preview_chars",
            ),
            ("[spill]\nthreshhold_chars = 100\n", "threshhold_chars"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
