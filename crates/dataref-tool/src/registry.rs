use std::collections::BTreeMap;
use std::sync::Arc;

use dataref_config::SpillConfig;
use dataref_protocol::ToolSpec;

use crate::{RecordsCsv, Tool, ToolsError, cap, listed};

pub(crate) struct Entry {
    pub tool: Arc<dyn Tool>,
    /// The spec as listed: for our tools, the schemas in their portable form, the output
    /// schema folded with the truncation object of the result cap and the spill synopsis
    /// when the tool's results may be spilled ([`crate::listed`]); an upstream tool's own
    /// output schema is one alternative beside those.
    pub spec: ToolSpec,
    /// The tool's own input schema, as the tool wrote it: arguments are checked against
    /// it (so an explicit `null` for an optional argument still passes, and an unsigned
    /// argument still refuses a negative number), and hints are made from it.
    pub own_input: serde_json::Value,
    pub validator: jsonschema::Validator,
    /// Results longer than this many characters are spilled; `None`: never.
    pub spill_threshold: Option<usize>,
}

/// Collects tools, then builds the immutable [`ToolRegistry`].
#[derive(Default)]
pub struct ToolRegistryBuilder {
    tools: Vec<Arc<dyn Tool>>,
    spill: SpillConfig,
    records_csv: Option<Arc<dyn RecordsCsv>>,
}

impl ToolRegistryBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) -> &mut Self {
        self.tools.push(tool);
        self
    }

    /// When results are spilled to the caller's workspace (default: [`SpillConfig::default`]).
    pub fn spill(&mut self, spill: SpillConfig) -> &mut Self {
        self.spill = spill;
        self
    }

    /// How flat records in a spilled result are written as CSV (and then stored as a table
    /// artifact); without one they are spilled as JSON only.
    pub fn records_csv(&mut self, writer: Arc<dyn RecordsCsv>) -> &mut Self {
        self.records_csv = Some(writer);
        self
    }

    /// Checks names are unique and compiles every input schema.
    pub fn build(self) -> Result<ToolRegistry, ToolsError> {
        let mut entries = BTreeMap::new();
        let mut order = Vec::new();
        for tool in self.tools {
            let mut spec = tool.spec().clone();
            let name = spec.name.clone();
            let validator = jsonschema::validator_for(&spec.input_schema).map_err(|e| {
                ToolsError::BadSchema {
                    name: name.clone(),
                    message: e.to_string(),
                }
            })?;
            // A tool only the view calls answers the view, not a model: nothing to spill.
            let spill_threshold = if spec.ui.app_only {
                None
            } else {
                self.spill.threshold_for(&name, tool.result_is_synopsis())
            };
            let spilled = spill_threshold.is_some();
            let own_input = spec.input_schema.clone();
            if tool.schemas_are_ours() {
                spec.input_schema = listed::portable_input(spec.input_schema);
                spec.output_schema = spec
                    .output_schema
                    .map(|o| cap::listed_output_schema(o, spilled));
            } else {
                spec.output_schema = spec
                    .output_schema
                    .map(|o| cap::widen_output_schema(o, spilled));
            }
            let entry = Entry {
                tool,
                spec,
                own_input,
                validator,
                spill_threshold,
            };
            if entries.insert(name.clone(), entry).is_some() {
                return Err(ToolsError::DuplicateName(name));
            }
            order.push(name);
        }
        Ok(ToolRegistry {
            entries,
            order,
            spill: self.spill,
            records_csv: self.records_csv,
        })
    }
}

/// Every tool a session can call, with compiled validators. Immutable once built.
pub struct ToolRegistry {
    entries: BTreeMap<String, Entry>,
    /// Registration order, which is the order tools are listed in.
    order: Vec<String>,
    spill: SpillConfig,
    records_csv: Option<Arc<dyn RecordsCsv>>,
}

impl ToolRegistry {
    pub fn builder() -> ToolRegistryBuilder {
        ToolRegistryBuilder::new()
    }

    /// Specs as listed to clients, in registration order. A tool whose results may be
    /// spilled lists an output schema that also admits the spill synopsis.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.order
            .iter()
            .filter_map(|n| self.entries.get(n).map(|e| &e.spec))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.entries.get(name).map(|e| &e.tool)
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// The spill settings the registry was built with.
    pub fn spill_config(&self) -> &SpillConfig {
        &self.spill
    }

    /// The CSV writer for spilled records, when the registry was given one.
    pub fn records_csv(&self) -> Option<Arc<dyn RecordsCsv>> {
        self.records_csv.clone()
    }

    /// Characters above which `name`'s results are spilled; `None` when they never are.
    pub fn spill_threshold(&self, name: &str) -> Option<usize> {
        self.entries.get(name).and_then(|e| e.spill_threshold)
    }

    /// A registry of the tools named in `names` only (in this registry's order), with the
    /// same spill settings and CSV writer: an agent profile's tool set. A `call_tool` in it
    /// reaches only the tools in it, because its calls are resolved by this registry. A name
    /// this registry lacks is left out (the caller resolved the names against it).
    pub fn subset(&self, names: &[String]) -> Result<ToolRegistry, ToolsError> {
        let mut builder = ToolRegistryBuilder::new();
        for name in &self.order {
            if names.contains(name)
                && let Some(e) = self.entries.get(name)
            {
                builder.register(e.tool.clone());
            }
        }
        builder.spill(self.spill.clone());
        if let Some(csv) = &self.records_csv {
            builder.records_csv(csv.clone());
        }
        builder.build()
    }

    pub fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// The tools a model may be offered, in order: every one but the view's own
    /// (`ui.app_only`), which only a person's view calls.
    pub fn model_names(&self) -> Vec<String> {
        self.specs()
            .filter(|s| !s.ui.app_only)
            .map(|s| s.name.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.order).finish()
    }
}
