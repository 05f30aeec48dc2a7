use std::collections::BTreeMap;
use std::sync::Arc;

use dataref_protocol::ToolSpec;

use crate::{Tool, ToolsError};

pub(crate) struct Entry {
    pub tool: Arc<dyn Tool>,
    pub validator: jsonschema::Validator,
}

/// Collects tools, then builds the immutable [`ToolRegistry`].
#[derive(Default)]
pub struct ToolRegistryBuilder {
    tools: Vec<Arc<dyn Tool>>,
}

impl ToolRegistryBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) -> &mut Self {
        self.tools.push(tool);
        self
    }

    /// Checks names are unique and compiles every input schema.
    pub fn build(self) -> Result<ToolRegistry, ToolsError> {
        let mut entries = BTreeMap::new();
        let mut order = Vec::new();
        for tool in self.tools {
            let name = tool.spec().name.clone();
            let validator = jsonschema::validator_for(&tool.spec().input_schema).map_err(|e| {
                ToolsError::BadSchema {
                    name: name.clone(),
                    message: e.to_string(),
                }
            })?;
            if entries
                .insert(name.clone(), Entry { tool, validator })
                .is_some()
            {
                return Err(ToolsError::DuplicateName(name));
            }
            order.push(name);
        }
        Ok(ToolRegistry { entries, order })
    }
}

/// Every tool a session can call, with compiled validators. Immutable once built.
pub struct ToolRegistry {
    entries: BTreeMap<String, Entry>,
    /// Registration order, which is the order tools are listed in.
    order: Vec<String>,
}

impl ToolRegistry {
    pub fn builder() -> ToolRegistryBuilder {
        ToolRegistryBuilder::new()
    }

    /// Specs in registration order.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.order
            .iter()
            .filter_map(|n| self.entries.get(n).map(|e| e.tool.spec()))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.entries.get(name).map(|e| &e.tool)
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        self.order.clone()
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
