//! Agent profiles (`[agents.NAME]`) resolved against the tool registry: the tool set (IDs
//! and patterns; `read_file` added whenever a tool can spill, unless `read_spilled =
//! false`), the compiled system prompt, the tokenizer and the model endpoint. A profile's
//! tools are a registry of their own, so a `call_tool` of the profile reaches only the
//! profile's tools.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use dataref_config::{AgentConfig, Approval, Config, PromptSource, SourceKind};
use dataref_tool::ToolRegistry;
use dataref_workspace::Glob;
use serde_json::{Value, json};

use crate::llm::{ChatModel, OpenAiCompatible, OpenAiSettings};
use crate::message::ToolDefinition;
use crate::prompt::{BUILTIN_VARIABLES, DEFAULT_TEMPLATE, PromptTemplate};
use crate::tokens::TokenCounter;

/// The tool every profile with a spilling tool gets, so a spilled result can be read.
pub const READ_FILE: &str = "read_file";

/// Why a profile could not be resolved: each names the profile and the key.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("agents.{agent}.tools: `{id}` names no tool{close}")]
    UnknownTool {
        agent: String,
        id: String,
        close: String,
    },
    #[error("agents.{agent}.tools: `{id}` is not a valid pattern: {detail}")]
    BadPattern {
        agent: String,
        id: String,
        detail: String,
    },
    #[error("agents.{agent}.approval: `{id}` names no tool of this agent")]
    UnknownApproval { agent: String, id: String },
    #[error("agents.{agent}.prompt: {detail}")]
    Prompt { agent: String, detail: String },
    #[error("agents.{agent}.prompt_file `{path}`: {detail}")]
    PromptFile {
        agent: String,
        path: String,
        detail: String,
    },
    #[error("agents.{agent}.encoding: {detail}")]
    Tokenizer { agent: String, detail: String },
    #[error("agents.{agent}.api_key: {detail}")]
    ApiKey { agent: String, detail: String },
    #[error("agents.{agent}: the tool set cannot be built: {detail}")]
    Registry { agent: String, detail: String },
    #[error("no agent named `{0}`; agents: {1}")]
    NoSuchAgent(String, String),
    #[error("agent `{agent}` has no model endpoint")]
    NoEndpoint { agent: String },
}

impl ProfileError {
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::UnknownTool { .. } => Some(
                "a tool ID is a name the server lists in `tools/list`: a built-in such as \
                 `run_sql`, `fetch_<query>` for each named query, an HTTP tool's name, or a \
                 mounted server's tools under its prefix; or a pattern like `fetch_*`"
                    .into(),
            ),
            Self::UnknownApproval { .. } => {
                Some("name a tool the profile's `tools` include, or a pattern".into())
            }
            Self::Prompt { .. } => Some(format!(
                "built-in variables: {}; add your own under [agents.NAME.vars]",
                BUILTIN_VARIABLES.join(", ")
            )),
            Self::NoEndpoint { .. } => Some(
                "set DATAREF_LLM_URL (an OpenAI-compatible base URL, e.g. \
                 https://api.openai.com/v1 or http://localhost:11434/v1) and DATAREF_LLM_MODEL, \
                 or `url` and `model` in [agents.NAME]"
                    .into(),
            ),
            Self::ApiKey { .. } => Some("export the variable, or remove `api_key`".into()),
            _ => None,
        }
    }
}

/// One resolved profile: everything a run of this agent needs except the caller.
pub struct Agent {
    pub name: String,
    pub config: AgentConfig,
    /// The profile's tools only.
    pub registry: Arc<ToolRegistry>,
    /// The tools as the model is offered them.
    pub definitions: Vec<ToolDefinition>,
    pub template: PromptTemplate,
    pub counter: Arc<TokenCounter>,
    /// `None` when no endpoint is configured (the host may put in a model of its own).
    pub model: Option<Arc<dyn ChatModel>>,
    /// The variables that do not change per run: `agent`, `tools`, `sources`, `queries`,
    /// the profile's own.
    pub vars: BTreeMap<String, Value>,
    /// The usage ledger and the budgets its runs count against; `None` counts nothing
    /// (set by the [`AgentHost`](crate::AgentHost) from its sessions' ledger).
    pub metering: Option<crate::budget::Metering>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.name)
            .field("tools", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Resolves `profile` against `registry` (the whole one: built-ins, `fetch_*`, HTTP and
    /// upstream tools). A `prompt_file` is read here (config resolution made it absolute).
    pub fn resolve(
        profile: &AgentConfig,
        config: &Config,
        registry: &ToolRegistry,
    ) -> Result<Self, ProfileError> {
        let agent = profile.name.clone();
        // The view's own tools (app-only) are no model's: no profile can name them.
        let names = registry.model_names();
        let mut chosen: Vec<String> = Vec::new();
        for id in &profile.tools {
            let glob = Glob::new(id).map_err(|e| ProfileError::BadPattern {
                agent: agent.clone(),
                id: id.clone(),
                detail: e.to_string(),
            })?;
            let matched: Vec<&String> = names.iter().filter(|n| glob.matches(n)).collect();
            if matched.is_empty() {
                let close = dataref_store::closest(id, &names);
                let close = if close.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; did you mean {}?",
                        close
                            .iter()
                            .map(|c| format!("`{c}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(ProfileError::UnknownTool {
                    agent,
                    id: id.clone(),
                    close,
                });
            }
            for m in matched {
                if !chosen.contains(m) {
                    chosen.push(m.clone());
                }
            }
        }
        let spills = chosen.iter().any(|n| registry.spill_threshold(n).is_some());
        if profile.read_spilled
            && spills
            && !chosen.iter().any(|n| n == READ_FILE)
            && registry.get(READ_FILE).is_some()
        {
            chosen.push(READ_FILE.to_owned());
        }
        for (id, _) in &profile.approvals {
            let known = Glob::new(id)
                .map(|g| chosen.iter().any(|n| g.matches(n)))
                .unwrap_or(false);
            if !known {
                return Err(ProfileError::UnknownApproval {
                    agent,
                    id: id.clone(),
                });
            }
        }
        let registry = registry
            .subset(&chosen)
            .map_err(|e| ProfileError::Registry {
                agent: agent.clone(),
                detail: e.to_string(),
            })?;
        let definitions: Vec<ToolDefinition> = registry
            .specs()
            .map(|s| ToolDefinition {
                name: s.name.clone(),
                description: s.description.clone(),
                parameters: s.input_schema.clone(),
            })
            .collect();

        let (template_name, source) = match &profile.prompt {
            PromptSource::Default => ("the default prompt".to_owned(), DEFAULT_TEMPLATE.to_owned()),
            PromptSource::Inline(s) => (format!("agents.{agent}.prompt"), s.clone()),
            PromptSource::File(p) => (p.display().to_string(), read_prompt_file(&agent, p)?),
        };
        let template =
            PromptTemplate::new(&template_name, &source).map_err(|e| ProfileError::Prompt {
                agent: agent.clone(),
                detail: e.to_string(),
            })?;
        let mut known: Vec<&str> = BUILTIN_VARIABLES.to_vec();
        known.extend(profile.vars.keys().map(String::as_str));
        template
            .check_variables(&known)
            .map_err(|e| ProfileError::Prompt {
                agent: agent.clone(),
                detail: e.to_string(),
            })?;

        let model_name = profile.model.model.clone().unwrap_or_default();
        let counter = TokenCounter::for_model(&model_name, profile.model.encoding.as_deref())
            .map_err(|detail| ProfileError::Tokenizer {
                agent: agent.clone(),
                detail,
            })?;
        let model = match &profile.model.url {
            None => None,
            Some(url) => Some(endpoint(&agent, profile, url)?),
        };
        let vars = static_vars(profile, config, &definitions);
        Ok(Self {
            name: agent,
            config: profile.clone(),
            registry: Arc::new(registry),
            definitions,
            template,
            counter: Arc::new(counter),
            model,
            vars,
            metering: None,
        })
    }

    /// The policy for `tool`: an exact name first, then the longest matching pattern, then
    /// the profile's default.
    pub fn approval(&self, tool: &str) -> Approval {
        for (id, policy) in &self.config.approvals {
            if id == tool {
                return *policy;
            }
        }
        for (id, policy) in &self.config.approvals {
            if Glob::new(id).is_ok_and(|g| g.matches(tool)) {
                return *policy;
            }
        }
        self.config.default_approval
    }

    /// The model name sent in requests.
    pub fn model_name(&self) -> &str {
        self.config.model.model.as_deref().unwrap_or("")
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "a prompt file the operator named in dataref.toml, not a workspace file"
)]
fn read_prompt_file(agent: &str, path: &Path) -> Result<String, ProfileError> {
    std::fs::read_to_string(path).map_err(|e| ProfileError::PromptFile {
        agent: agent.to_owned(),
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn endpoint(
    agent: &str,
    profile: &AgentConfig,
    url: &str,
) -> Result<Arc<dyn ChatModel>, ProfileError> {
    Ok(Arc::new(client(agent, profile, url)?))
}

/// The client of a profile's endpoint, its key expanded from the environment (for
/// `dataref doctor`, which asks the endpoint for its models); `None` without a URL.
pub fn endpoint_client(profile: &AgentConfig) -> Result<Option<OpenAiCompatible>, ProfileError> {
    match &profile.model.url {
        Some(url) => client(&profile.name, profile, url).map(Some),
        None => Ok(None),
    }
}

fn client(agent: &str, profile: &AgentConfig, url: &str) -> Result<OpenAiCompatible, ProfileError> {
    let api_key = match &profile.model.api_key {
        None => None,
        Some(raw) => Some(
            dataref_config::env::expand(raw, &dataref_config::env::process).map_err(|e| {
                ProfileError::ApiKey {
                    agent: agent.to_owned(),
                    detail: match e {
                        dataref_config::env::ExpandError::Unset(v) => {
                            format!("`${{{v}}}` is not set")
                        }
                        dataref_config::env::ExpandError::Malformed(m) => m,
                    },
                }
            })?,
        ),
    };
    let mut settings = OpenAiSettings::new(url);
    settings.api_key = api_key.filter(|k| !k.is_empty());
    settings.timeout = profile.model.timeout;
    settings.max_retries = profile.model.max_retries;
    settings.stream = profile.model.stream;
    OpenAiCompatible::new(settings).map_err(|e| ProfileError::Registry {
        agent: agent.to_owned(),
        detail: e.to_string(),
    })
}

fn static_vars(
    profile: &AgentConfig,
    config: &Config,
    tools: &[ToolDefinition],
) -> BTreeMap<String, Value> {
    let mut vars = BTreeMap::new();
    vars.insert("agent".to_owned(), json!(profile.name));
    vars.insert(
        "tools".to_owned(),
        Value::Array(
            tools
                .iter()
                .map(|t| json!({"name": t.name, "description": first_sentence(&t.description)}))
                .collect(),
        ),
    );
    vars.insert(
        "sources".to_owned(),
        Value::Array(
            config
                .sources
                .values()
                .map(|s| {
                    let kind = match &s.kind {
                        SourceKind::Sqlite { .. } => "sqlite",
                        SourceKind::Postgres { .. } => "postgres",
                        SourceKind::Mysql { .. } => "mysql",
                        SourceKind::Adbc { .. } => "adbc",
                        SourceKind::Files { .. } => "files",
                        _ => "other",
                    };
                    json!({"name": s.name, "kind": kind, "description": ""})
                })
                .collect(),
        ),
    );
    let offered: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    vars.insert(
        "queries".to_owned(),
        Value::Array(
            config
                .queries
                .values()
                .filter(|q| offered.contains(&q.tool_name().as_str()))
                .map(|q| json!({"name": q.tool_name(), "description": first_sentence(&q.description)}))
                .collect(),
        ),
    );
    for (k, v) in &profile.vars {
        vars.insert(k.clone(), json!(v));
    }
    vars
}

fn first_sentence(s: &str) -> &str {
    let line = s.lines().next().unwrap_or("");
    match line.find(". ") {
        Some(i) => &line[..=i],
        None => line,
    }
}
