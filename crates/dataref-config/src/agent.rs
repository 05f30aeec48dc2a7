//! `[agents.NAME]`: agent profiles a product team writes — which model endpoint, which
//! prompt, which tools, what limits and which approvals. Tool IDs and patterns are kept as
//! written: the registry is built later, and the agent runtime checks them against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::env::{DATAREF_LLM_API_KEY, DATAREF_LLM_MODEL, DATAREF_LLM_URL};
use crate::error::{ConfigError, invalid, is_identifier};
use crate::raw::{RawAgent, RawAgentLimits};
use crate::units::duration;

/// The name of the profile a file without `[agents]` (and the built-in sample) gets.
pub const DEFAULT_AGENT: &str = "default";

/// Tokenizers a profile may name in `encoding`.
pub const ENCODINGS: [&str; 4] = ["o200k_base", "cl100k_base", "p50k_base", "r50k_base"];

/// One `[agents.NAME]` profile, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub name: String,
    pub model: ModelEndpoint,
    pub prompt: PromptSource,
    /// `[agents.NAME.vars]`: values for the prompt template.
    pub vars: BTreeMap<String, String>,
    /// Tool IDs or patterns (`fetch_*`). Default `["*"]` (all).
    pub tools: Vec<String>,
    /// Whether `read_file` joins the tools when one of them can spill, so the model can
    /// read a spilled result's file. Default true.
    pub read_spilled: bool,
    /// `[agents.NAME.limits]`.
    pub limits: AgentLimits,
    /// `[agents.NAME.approval]`: tool or pattern → policy, exact names first (by name), then
    /// patterns, longest first: the first entry that matches a tool decides.
    pub approvals: Vec<(String, Approval)>,
    /// `default` inside `[agents.NAME.approval]`: the policy of a tool no entry names.
    /// Default `Allow`.
    pub default_approval: Approval,
    /// `price_input` and `price_output`: what the model costs; `None` when not declared.
    pub prices: Option<Prices>,
}

/// What a model's tokens cost, per million, in the currency the profile's author chose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

impl Prices {
    /// The cost of `input` prompt tokens and `output` completion tokens.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_per_million + output as f64 * self.output_per_million) / 1e6
    }
}

/// An OpenAI-compatible Chat Completions endpoint. Its `Debug` shows a literal key as `***`
/// (a `${VAR}` reference as it is).
#[derive(Clone, PartialEq)]
pub struct ModelEndpoint {
    /// Base URL (`https://api.openai.com/v1`): the profile's `url`, else `DATAREF_LLM_URL`,
    /// else `None` (no model configured).
    pub url: Option<String>,
    /// The profile's `model`, else `DATAREF_LLM_MODEL`.
    pub model: Option<String>,
    /// Not expanded: may hold `${VAR}`, expanded when the request is made. The profile's
    /// `api_key`, else `${DATAREF_LLM_API_KEY}` when that variable was set at resolution.
    pub api_key: Option<String>,
    /// One request's deadline. Default 120 s.
    pub timeout: Duration,
    /// Retries of a request that failed in a way worth retrying. Default 4.
    pub max_retries: u32,
    /// Tokenizer override (one of [`ENCODINGS`]). Default: chosen from the model's name.
    pub encoding: Option<String>,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    /// Stream the answer (SSE). Default true.
    pub stream: bool,
}

impl std::fmt::Debug for ModelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = self.api_key.as_deref().map(|k| {
            if k.starts_with("${") && k.ends_with('}') && !k[2..].contains('$') {
                k
            } else {
                "***"
            }
        });
        f.debug_struct("ModelEndpoint")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &key)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("encoding", &self.encoding)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("stream", &self.stream)
            .finish()
    }
}

/// Where the system prompt template comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// dataref's own prompt.
    Default,
    /// `prompt = "..."`.
    Inline(String),
    /// `prompt_file = "path"`, relative to the config file's directory; read when the
    /// profile is used, not at resolution.
    File(PathBuf),
}

/// Bounds on one agent run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLimits {
    /// Model requests per run. Default 16.
    pub max_turns: u32,
    /// Tool calls per run. Default 50.
    pub max_tool_calls: u32,
    /// A run's wall clock. Default 10 min.
    pub wall_time: Duration,
    /// The model's context window, in tokens. Default 128,000.
    pub context_tokens: usize,
    /// One tool result, in tokens. Default 50,000.
    pub result_tokens: usize,
    /// Tokens kept free for the answer. Default 4,096.
    pub answer_tokens: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            max_turns: 16,
            max_tool_calls: 50,
            wall_time: Duration::from_secs(600),
            context_tokens: 128_000,
            result_tokens: 50_000,
            answer_tokens: 4_096,
        }
    }
}

/// What happens when the model calls a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    /// Run it.
    Allow,
    /// Ask the person first.
    Ask,
    /// Refuse it (the model is told).
    Deny,
}

impl Approval {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allow" => Self::Allow,
            "ask" => Self::Ask,
            "deny" => Self::Deny,
            _ => return None,
        })
    }
}

impl AgentConfig {
    /// The profile named `name` with every default; the endpoint from `env`
    /// (`DATAREF_LLM_URL`, `DATAREF_LLM_MODEL`, `DATAREF_LLM_API_KEY`).
    pub fn defaults(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            name: name.to_owned(),
            model: ModelEndpoint {
                url: env(DATAREF_LLM_URL).filter(|v| !v.trim().is_empty()),
                model: env(DATAREF_LLM_MODEL).filter(|v| !v.trim().is_empty()),
                api_key: env_api_key(env),
                timeout: Duration::from_secs(120),
                max_retries: 4,
                encoding: None,
                temperature: None,
                max_tokens: None,
                stream: true,
            },
            prompt: PromptSource::Default,
            vars: BTreeMap::new(),
            tools: vec!["*".to_owned()],
            read_spilled: true,
            limits: AgentLimits::default(),
            approvals: Vec::new(),
            default_approval: Approval::Allow,
            prices: None,
        }
    }
}

fn env_api_key(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    env(DATAREF_LLM_API_KEY).map(|_| format!("${{{DATAREF_LLM_API_KEY}}}"))
}

/// Whether a tool entry is a pattern rather than one tool's name.
fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '[', ']', '{', '}'])
}

pub(crate) fn resolve_agents(
    raw: BTreeMap<String, RawAgent>,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, AgentConfig>, ConfigError> {
    if raw.is_empty() {
        return Ok(default_agents(env));
    }
    let mut out = BTreeMap::new();
    for (name, a) in raw {
        let agent = resolve_agent(&name, a, base, env)?;
        out.insert(name, agent);
    }
    Ok(out)
}

/// What a config without `[agents]` has: the profile `default`.
pub(crate) fn default_agents(
    env: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, AgentConfig> {
    BTreeMap::from([(
        DEFAULT_AGENT.to_owned(),
        AgentConfig::defaults(DEFAULT_AGENT, env),
    )])
}

fn resolve_agent(
    name: &str,
    a: RawAgent,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AgentConfig, ConfigError> {
    let what = format!("agents.{name}");
    if !is_identifier(name) {
        return Err(invalid(
            &what,
            "agent names must be lower-case identifiers (letters, digits, `_`, at most 48)",
            "e.g. `[agents.sales_analyst]`",
        ));
    }
    let d = AgentConfig::defaults(name, env);
    let key = |k: &str| format!("{what}.{k}");

    // `DATAREF_LLM_URL` is taken as it is: a bad value is the gateway's error when a model
    // is called, never a reason for `serve` to refuse the file.
    let url = match a.url {
        Some(u) => Some(check_url(&key("url"), u)?),
        None => d.model.url,
    };
    let model = match a.model {
        Some(m) if m.trim().is_empty() => {
            return Err(invalid(
                key("model"),
                "is empty",
                "name the model, e.g. `model = \"gpt-4o-mini\"`, or leave it out to use `DATAREF_LLM_MODEL`",
            ));
        }
        Some(m) => Some(m),
        None => d.model.model,
    };
    let api_key = match a.api_key {
        Some(k) if k.trim().is_empty() => {
            return Err(invalid(
                key("api_key"),
                "is empty",
                "write `api_key = \"${MY_LLM_KEY}\"` (expanded from the environment when the model is called) or leave it out",
            ));
        }
        Some(k) => Some(k),
        None => d.model.api_key,
    };
    let timeout = duration(&key("timeout"), &a.timeout, d.model.timeout)?;
    if timeout.is_zero() {
        return Err(invalid(
            key("timeout"),
            "must be longer than zero",
            "the default is `120s`",
        ));
    }
    let max_retries = a.max_retries.unwrap_or(d.model.max_retries);
    if max_retries > 20 {
        return Err(invalid(
            key("max_retries"),
            "must be at most 20",
            "the default is 4; 0 never retries",
        ));
    }
    if let Some(e) = &a.encoding
        && !ENCODINGS.contains(&e.as_str())
    {
        return Err(invalid(
            key("encoding"),
            format!("unknown encoding `{e}`"),
            format!(
                "use one of {}, or leave it out to choose from the model's name",
                ENCODINGS.map(|e| format!("`{e}`")).join(", ")
            ),
        ));
    }
    if let Some(t) = a.temperature
        && !(t.is_finite() && (0.0..=2.0).contains(&t))
    {
        return Err(invalid(
            key("temperature"),
            format!("{t} is not between 0 and 2"),
            "e.g. `temperature = 0.2`, or leave it out for the model's default",
        ));
    }
    if a.max_tokens == Some(0) {
        return Err(invalid(
            key("max_tokens"),
            "must be above zero",
            "leave it out for the model's default",
        ));
    }
    let prices = match (a.price_input, a.price_output) {
        (None, None) => None,
        (Some(input), Some(output)) => {
            for (k, v) in [("price_input", input), ("price_output", output)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(
                        key(k),
                        format!("{v} is not a price"),
                        "give the price per million tokens as a number of zero or more, e.g. `price_input = 0.15`",
                    ));
                }
            }
            Some(Prices {
                input_per_million: input,
                output_per_million: output,
            })
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(invalid(
                &what,
                "`price_input` and `price_output` go together",
                "give both, per million tokens (e.g. `price_input = 0.15` and `price_output = 0.60`), or neither",
            ));
        }
    };
    let prompt = match (a.prompt, a.prompt_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &what,
                "`prompt` and `prompt_file` exclude each other",
                "keep `prompt = \"...\"` for a short template, or `prompt_file = \"prompts/analyst.md\"` (relative to this file)",
            ));
        }
        (Some(p), None) if p.trim().is_empty() => {
            return Err(invalid(
                key("prompt"),
                "is empty",
                "write the template, or leave it out for dataref's own prompt",
            ));
        }
        (Some(p), None) => PromptSource::Inline(p),
        (None, Some(f)) if f.trim().is_empty() => {
            return Err(invalid(
                key("prompt_file"),
                "is empty",
                "e.g. `prompt_file = \"prompts/analyst.md\"` (relative to this file)",
            ));
        }
        (None, Some(f)) => PromptSource::File(base.join(f)),
        (None, None) => PromptSource::Default,
    };
    for var in a.vars.keys() {
        let valid = var
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(invalid(
                format!("{what}.vars.{var}"),
                "is not a template variable name",
                "use letters, digits and `_`, e.g. `vars.team = \"EU sales\"`",
            ));
        }
    }
    let tools = a.tools.unwrap_or(d.tools);
    if let Some(bad) = tools.iter().find(|t| t.trim().is_empty() || t.trim() != *t) {
        return Err(invalid(
            key("tools"),
            format!("`{bad}` is not a tool name or pattern"),
            "e.g. `tools = [\"fetch_*\", \"describe_data\", \"render_chart\"]`; `[\"*\"]` (the default) is every tool",
        ));
    }
    let limits = resolve_limits(&what, &a.limits)?;
    let mut default_approval = d.default_approval;
    let mut exact = Vec::new();
    let mut patterns = Vec::new();
    for (tool, policy) in a.approval {
        let k = format!("{what}.approval.{tool}");
        let p = Approval::parse(&policy).ok_or_else(|| {
            invalid(
                &k,
                format!("`{policy}` is not an approval"),
                "use `allow`, `ask` or `deny`",
            )
        })?;
        if tool == "default" {
            default_approval = p;
        } else if tool.trim().is_empty() {
            return Err(invalid(
                &k,
                "names no tool",
                "e.g. `approval.run_python = \"ask\"` or `approval.\"export_*\" = \"deny\"`",
            ));
        } else if is_pattern(&tool) {
            patterns.push((tool, p));
        } else {
            exact.push((tool, p));
        }
    }
    // Longest first; ties by name (the map gave them sorted, and the sort is stable).
    patterns.sort_by_key(|(t, _)| std::cmp::Reverse(t.chars().count()));
    exact.extend(patterns);
    Ok(AgentConfig {
        name: name.to_owned(),
        model: ModelEndpoint {
            url,
            model,
            api_key,
            timeout,
            max_retries,
            encoding: a.encoding,
            temperature: a.temperature,
            max_tokens: a.max_tokens,
            stream: a.stream.unwrap_or(d.model.stream),
        },
        prompt,
        vars: a.vars,
        tools,
        read_spilled: a.read_spilled.unwrap_or(d.read_spilled),
        limits,
        approvals: exact,
        default_approval,
        prices,
    })
}

fn check_url(what: &str, url: String) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || url.contains(char::is_whitespace)
    {
        return Err(invalid(
            what,
            format!("`{url}` is not an http:// or https:// URL"),
            "give the OpenAI-compatible base URL, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`",
        ));
    }
    Ok(url)
}

fn resolve_limits(what: &str, raw: &RawAgentLimits) -> Result<AgentLimits, ConfigError> {
    let d = AgentLimits::default();
    let key = |k: &str| format!("{what}.limits.{k}");
    let limits = AgentLimits {
        max_turns: raw.max_turns.unwrap_or(d.max_turns),
        max_tool_calls: raw.max_tool_calls.unwrap_or(d.max_tool_calls),
        wall_time: duration(&key("wall_time"), &raw.wall_time, d.wall_time)?,
        context_tokens: raw.context_tokens.unwrap_or(d.context_tokens),
        result_tokens: raw.result_tokens.unwrap_or(d.result_tokens),
        answer_tokens: raw.answer_tokens.unwrap_or(d.answer_tokens),
    };
    let zero = [
        ("max_turns", limits.max_turns == 0, "16"),
        ("max_tool_calls", limits.max_tool_calls == 0, "50"),
        ("wall_time", limits.wall_time.is_zero(), "`10m`"),
        ("context_tokens", limits.context_tokens == 0, "128000"),
        ("result_tokens", limits.result_tokens == 0, "50000"),
        ("answer_tokens", limits.answer_tokens == 0, "4096"),
    ];
    if let Some((k, _, default)) = zero.iter().find(|(_, is_zero, _)| *is_zero) {
        return Err(invalid(
            key(k),
            "must be above zero",
            format!("the default is {default}"),
        ));
    }
    if limits.answer_tokens >= limits.context_tokens {
        return Err(invalid(
            key("answer_tokens"),
            format!(
                "{} leaves nothing of `context_tokens` ({}) for the conversation",
                limits.answer_tokens, limits.context_tokens
            ),
            "keep `answer_tokens` well below `context_tokens` (defaults 4096 and 128000)",
        ));
    }
    if limits.result_tokens > limits.context_tokens - limits.answer_tokens {
        return Err(invalid(
            key("result_tokens"),
            format!(
                "{} is more than `context_tokens` minus `answer_tokens` ({})",
                limits.result_tokens,
                limits.context_tokens - limits.answer_tokens
            ),
            "one tool result must fit in the context beside the answer; the default is 50000",
        ));
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn llm_env(name: &str) -> Option<String> {
        match name {
            DATAREF_LLM_URL => Some("http://localhost:11434/v1".into()),
            DATAREF_LLM_MODEL => Some("qwen3".into()),
            DATAREF_LLM_API_KEY => Some("sk-secret".into()),
            _ => None,
        }
    }

    fn parse_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::from_toml_str_with_env(
            text,
            "/etc/dataref".as_ref(),
            "/var/lib/dataref".into(),
            env,
        )
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        parse_env(text, &no_env)
    }

    #[test]
    fn no_agents_table_gives_the_default_profile() {
        let c = parse("").unwrap();
        assert_eq!(c.agents.len(), 1);
        let a = &c.agents[DEFAULT_AGENT];
        assert_eq!(a, &AgentConfig::defaults("default", &no_env));
        assert_eq!(a.model.url, None);
        assert_eq!(a.model.api_key, None);
        assert_eq!(a.model.timeout, Duration::from_secs(120));
        assert_eq!(a.model.max_retries, 4);
        assert!(a.model.stream);
        assert_eq!(a.prompt, PromptSource::Default);
        assert_eq!(a.tools, vec!["*".to_owned()]);
        assert_eq!(a.limits, AgentLimits::default());
        assert_eq!(a.limits.max_turns, 16);
        assert_eq!(a.limits.wall_time, Duration::from_secs(600));
        assert_eq!(a.default_approval, Approval::Allow);
        assert!(a.approvals.is_empty());
    }

    #[test]
    fn the_endpoint_comes_from_the_env_when_the_profile_names_none() {
        let c = parse_env("", &llm_env).unwrap();
        let m = &c.agents["default"].model;
        assert_eq!(m.url.as_deref(), Some("http://localhost:11434/v1"));
        assert_eq!(m.model.as_deref(), Some("qwen3"));
        // The key itself never enters the config, only the reference to it.
        assert_eq!(m.api_key.as_deref(), Some("${DATAREF_LLM_API_KEY}"));
        let sample = Config::builtin_sample_with_env("/h".into(), 100, &llm_env);
        assert_eq!(sample.agents["default"].model, *m);
        let sample = Config::builtin_sample_with_env("/h".into(), 100, &no_env);
        assert_eq!(sample.agents["default"].model.url, None);

        let c = parse_env(
            "[agents.a]\nurl = \"https://llm.internal/v1\"\nmodel = \"m\"\napi_key = \"${TEAM_KEY}\"",
            &llm_env,
        )
        .unwrap();
        let m = &c.agents["a"].model;
        assert_eq!(m.url.as_deref(), Some("https://llm.internal/v1"));
        assert_eq!(m.model.as_deref(), Some("m"));
        assert_eq!(m.api_key.as_deref(), Some("${TEAM_KEY}"));
        // A file with agents has only those.
        assert!(!c.agents.contains_key("default"));

        // A variable set to nothing is no endpoint.
        let empty = |n: &str| (n == DATAREF_LLM_URL).then(String::new);
        assert_eq!(
            parse_env("", &empty).unwrap().agents["default"].model.url,
            None
        );
    }

    #[test]
    fn a_full_profile() {
        let c = parse(
            r#"
[agents.analyst]
url = "https://llm.internal/v1"
model = "gpt-4o-mini"
timeout = "45s"
max_retries = 0
encoding = "o200k_base"
temperature = 0.2
max_tokens = 2000
stream = false
price_input = 0.15
price_output = 0.6
prompt_file = "prompts/analyst.md"
tools = ["fetch_*", "describe_data", "run_python"]
[agents.analyst.vars]
team = "EU sales"
[agents.analyst.limits]
max_turns = 8
max_tool_calls = 20
wall_time = "5m"
context_tokens = 64000
result_tokens = 8000
answer_tokens = 2000
[agents.analyst.approval]
default = "ask"
run_python = "allow"
"export_*" = "deny"
"*" = "ask"
"fetch_{a,b}" = "allow"
describe_data = "allow"

[agents.quick]
prompt = "You are {{ team }}'s assistant."
"#,
        )
        .unwrap();
        let a = &c.agents["analyst"];
        assert_eq!(a.name, "analyst");
        assert_eq!(a.model.timeout, Duration::from_secs(45));
        assert_eq!(a.model.max_retries, 0);
        assert_eq!(a.model.encoding.as_deref(), Some("o200k_base"));
        assert_eq!(a.model.temperature, Some(0.2));
        assert_eq!(a.model.max_tokens, Some(2000));
        let prices = a.prices.unwrap();
        assert!((prices.cost(1_000_000, 500_000) - 0.45).abs() < 1e-12);
        assert_eq!(c.agents["quick"].prices, None);
        assert!(!a.model.stream);
        assert_eq!(
            a.prompt,
            PromptSource::File(PathBuf::from("/etc/dataref/prompts/analyst.md"))
        );
        assert_eq!(a.vars["team"], "EU sales");
        assert_eq!(a.tools.len(), 3);
        assert_eq!(
            a.limits,
            AgentLimits {
                max_turns: 8,
                max_tool_calls: 20,
                wall_time: Duration::from_secs(300),
                context_tokens: 64_000,
                result_tokens: 8_000,
                answer_tokens: 2_000,
            }
        );
        assert_eq!(a.default_approval, Approval::Ask);
        let order: Vec<_> = a.approvals.iter().map(|(t, p)| (t.as_str(), *p)).collect();
        assert_eq!(
            order,
            [
                ("describe_data", Approval::Allow),
                ("run_python", Approval::Allow),
                ("fetch_{a,b}", Approval::Allow),
                ("export_*", Approval::Deny),
                ("*", Approval::Ask),
            ]
        );
        let q = &c.agents["quick"];
        assert_eq!(
            q.prompt,
            PromptSource::Inline("You are {{ team }}'s assistant.".into())
        );
        assert_eq!(q.limits, AgentLimits::default());
    }

    #[test]
    fn bad_profiles_name_the_key() {
        for (text, key) in [
            ("[agents.a]\nmodle = \"x\"", "unknown field `modle`"),
            ("[agents.a.limits]\nturns = 3", "unknown field `turns`"),
            (
                "[agents.a.limits]\nmax_turns = 0",
                "agents.a.limits.max_turns",
            ),
            (
                "[agents.a.limits]\nmax_tool_calls = 0",
                "agents.a.limits.max_tool_calls",
            ),
            (
                "[agents.a.limits]\nwall_time = 0",
                "agents.a.limits.wall_time",
            ),
            (
                "[agents.a.limits]\nwall_time = \"soon\"",
                "agents.a.limits.wall_time",
            ),
            (
                "[agents.a.limits]\ncontext_tokens = 0",
                "agents.a.limits.context_tokens",
            ),
            (
                "[agents.a.limits]\nresult_tokens = 0",
                "agents.a.limits.result_tokens",
            ),
            (
                "[agents.a.limits]\nanswer_tokens = 0",
                "agents.a.limits.answer_tokens",
            ),
            (
                "[agents.a.limits]\ncontext_tokens = 4000\nanswer_tokens = 4000",
                "agents.a.limits.answer_tokens",
            ),
            (
                "[agents.a.limits]\ncontext_tokens = 10000\nresult_tokens = 9000",
                "agents.a.limits.result_tokens",
            ),
            (
                "[agents.a.approval]\nrun_python = \"maybe\"",
                "agents.a.approval.run_python",
            ),
            (
                "[agents.a.approval]\ndefault = \"yes\"",
                "agents.a.approval.default",
            ),
            ("[agents.a]\nencoding = \"gpt2\"", "agents.a.encoding"),
            (
                "[agents.a]\nprompt = \"x\"\nprompt_file = \"p.md\"",
                "exclude each other",
            ),
            ("[agents.a]\nprompt = \" \"", "agents.a.prompt"),
            ("[agents.a]\nurl = \"llm.internal\"", "agents.a.url"),
            ("[agents.a]\ntimeout = 0", "agents.a.timeout"),
            ("[agents.a]\ntemperature = 3.5", "agents.a.temperature"),
            ("[agents.a]\nmax_tokens = 0", "agents.a.max_tokens"),
            (
                "[agents.a]\nprice_input = -1\nprice_output = 1",
                "agents.a.price_input",
            ),
            ("[agents.a]\nprice_output = 0.6", "go together"),
            ("[agents.a]\nmax_retries = 100", "agents.a.max_retries"),
            ("[agents.a]\nmodel = \"\"", "agents.a.model"),
            ("[agents.a]\ntools = [\"\"]", "agents.a.tools"),
            (
                "[agents.a.vars]\n\"my-var\" = \"x\"",
                "agents.a.vars.my-var",
            ),
            ("[agents.\"Bad Name\"]\n", "agents.Bad Name"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
            assert!(
                e.contains("hint") || e.contains("unknown field"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn approvals_deserialize_lowercase() {
        let a: Approval = serde_json::from_str("\"ask\"").unwrap();
        assert_eq!(a, Approval::Ask);
        assert_eq!(serde_json::to_string(&Approval::Deny).unwrap(), "\"deny\"");
        assert_eq!(Approval::Allow.as_str(), "allow");
    }
}
