//! `[[upstream]]`: other MCP servers whose tools dataref serves behind its own, prefixed,
//! with spill and delegated calls applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{ConfigError, invalid, is_identifier};
use crate::raw::RawUpstream;
use crate::units::duration;

/// One upstream MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// A lower-case identifier, used in logs and in the default prefix.
    pub name: String,
    pub transport: UpstreamTransport,
    /// Put before every upstream tool's name. Default `<name>_`.
    pub prefix: String,
    /// Only these upstream tools (their names upstream, without the prefix). Default: all.
    pub tools: Option<Vec<String>>,
    /// One upstream call is cancelled after this long. Default 120 s.
    pub timeout: Duration,
}

/// How to reach an upstream server. Values in `env` and `headers` may name environment
/// variables as `${NAME}`; they are expanded when dataref connects, so secrets stay out
/// of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamTransport {
    /// A child process speaking MCP on stdin/stdout: `command[0]` with the rest as
    /// arguments, the given environment added to dataref's.
    Stdio {
        command: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint with extra request headers (e.g. `Authorization`).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

pub(crate) fn resolve_upstreams(
    raw: Vec<RawUpstream>,
    base: &Path,
) -> Result<Vec<UpstreamConfig>, ConfigError> {
    let mut out: Vec<UpstreamConfig> = Vec::with_capacity(raw.len());
    for (i, u) in raw.into_iter().enumerate() {
        let what = format!("upstream[{i}]");
        if !is_identifier(&u.name) {
            return Err(invalid(
                format!("{what}.name"),
                format!("`{}` is not a lower-case identifier", u.name),
                "e.g. `name = \"github\"`",
            ));
        }
        if out.iter().any(|o| o.name == u.name) {
            return Err(invalid(
                format!("{what}.name"),
                format!("two upstream servers are named `{}`", u.name),
                "give each `[[upstream]]` its own name",
            ));
        }
        let what = format!("upstream.{}", u.name);
        let transport = match (u.command, u.url) {
            (Some(command), None) => {
                if command.first().is_none_or(|c| c.trim().is_empty()) {
                    return Err(invalid(
                        format!("{what}.command"),
                        "is empty",
                        "e.g. `command = [\"npx\", \"-y\", \"@modelcontextprotocol/server-everything\"]`",
                    ));
                }
                if !u.headers.is_empty() {
                    return Err(invalid(
                        format!("{what}.headers"),
                        "headers are for `url` servers",
                        "pass secrets to a command through `env`",
                    ));
                }
                UpstreamTransport::Stdio {
                    command,
                    env: u.env,
                    cwd: u.cwd.map(|c| base.join(c)),
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        format!("{what}.url"),
                        format!("`{url}` is not an http:// or https:// URL"),
                        "e.g. `url = \"https://mcp.example.com/mcp\"`",
                    ));
                }
                if !u.env.is_empty() || u.cwd.is_some() {
                    return Err(invalid(
                        format!("{what}.env"),
                        "`env` and `cwd` are for `command` servers",
                        "pass secrets to a URL server through `headers`",
                    ));
                }
                UpstreamTransport::Http {
                    url,
                    headers: u.headers,
                }
            }
            _ => {
                return Err(invalid(
                    &what,
                    "needs exactly one of `command` and `url`",
                    "`command = [\"program\", \"arg\"]` for a stdio server, `url = \"https://…\"` for Streamable HTTP",
                ));
            }
        };
        let prefix = u.prefix.unwrap_or_else(|| format!("{}_", u.name));
        if !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || prefix.len() > 32
        {
            return Err(invalid(
                format!("{what}.prefix"),
                format!("`{prefix}` may only hold letters, digits, `_` and `-` (at most 32)"),
                "the default is the name and `_`",
            ));
        }
        let timeout = duration(
            &format!("{what}.timeout"),
            &u.timeout,
            Duration::from_secs(120),
        )?;
        if timeout.is_zero() {
            return Err(invalid(
                format!("{what}.timeout"),
                "must be longer than zero",
                "the default is `120s`",
            ));
        }
        out.push(UpstreamConfig {
            name: u.name,
            transport,
            prefix,
            tools: u.tools,
            timeout,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "/etc/dataref".as_ref(), "/var/lib/dataref".into())
    }

    #[test]
    fn stdio_and_http_servers() {
        let c = parse(
            r#"
[[upstream]]
name = "everything"
command = ["npx", "-y", "@modelcontextprotocol/server-everything"]
env = { TOKEN = "${EVERYTHING_TOKEN}" }
cwd = "work"

[[upstream]]
name = "docs"
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer ${DOCS_TOKEN}" }
prefix = "d_"
tools = ["search"]
timeout = "30s"
"#,
        )
        .unwrap();
        assert_eq!(c.upstreams.len(), 2);
        let e = &c.upstreams[0];
        assert_eq!(e.prefix, "everything_");
        assert_eq!(e.timeout, Duration::from_secs(120));
        assert_eq!(
            e.transport,
            UpstreamTransport::Stdio {
                command: vec![
                    "npx".into(),
                    "-y".into(),
                    "@modelcontextprotocol/server-everything".into()
                ],
                env: BTreeMap::from([("TOKEN".into(), "${EVERYTHING_TOKEN}".into())]),
                cwd: Some(PathBuf::from("/etc/dataref/work")),
            }
        );
        let d = &c.upstreams[1];
        assert_eq!(d.prefix, "d_");
        assert_eq!(d.tools.as_deref(), Some(&["search".to_owned()][..]));
        assert!(
            matches!(&d.transport, UpstreamTransport::Http { url, .. } if url.ends_with("/mcp"))
        );
    }

    #[test]
    fn bad_upstreams_name_the_key() {
        for (text, key) in [
            ("[[upstream]]\nname = \"x\"\n", "upstream.x"),
            (
                "[[upstream]]\nname = \"x\"\ncommand = [\"a\"]\nurl = \"http://h\"\n",
                "exactly one",
            ),
            (
                "[[upstream]]\nname = \"x\"\ncommand = []\n",
                "upstream.x.command",
            ),
            (
                "[[upstream]]\nname = \"x\"\nurl = \"ftp://h\"\n",
                "upstream.x.url",
            ),
            (
                "[[upstream]]\nname = \"X Y\"\ncommand = [\"a\"]\n",
                "upstream[0].name",
            ),
            (
                "[[upstream]]\nname = \"x\"\ncommand = [\"a\"]\n[[upstream]]\nname = \"x\"\ncommand = [\"b\"]\n",
                "two upstream",
            ),
            (
                "[[upstream]]\nname = \"x\"\ncommand = [\"a\"]\nprefix = \"a b\"\n",
                "upstream.x.prefix",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
