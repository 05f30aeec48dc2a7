//! Token counts with the model's tokenizer (tiktoken's BPEs).
//!
//! - The encoding is the one the configuration names (`o200k_base`, `cl100k_base`,
//!   `p50k_base`, `r50k_base`), else the one tiktoken knows for the model name
//!   (`gpt-4o`, `gpt-4.1`, `o1`, `o3`, `gpt-5…` → `o200k_base`; `gpt-4`, `gpt-3.5…` →
//!   `cl100k_base`; `gpt-oss…` → `o200k_harmony`). A provider prefix (`openai/gpt-4o`) is
//!   ignored.
//! - Models tiktoken does not know (Llama, Qwen, Mistral… served by vLLM or Ollama) are
//!   counted with `o200k_base` as an **approximation**: their own tokenizers differ, by
//!   some ten percent either way on typical text. [`TokenCounter::is_approximate`] says so;
//!   keep a margin in the budget for them.
//! - Each BPE is loaded once per process (tiktoken-rs' singletons; loading takes ~100 ms),
//!   on the first count, not when a profile is resolved: a server that never runs an agent
//!   never loads one, and one that does answers its first request before.
//! - Message counts follow OpenAI's accounting (the cookbook's `num_tokens_from_messages`):
//!   a few tokens of framing per message, the role, the content, each tool call's name and
//!   arguments, the `tool_call_id`; plus [`REPLY_PRIMING`] once per request. They are cached
//!   by a 64-bit hash of the message, so counting a long history every turn costs a hash of
//!   its text.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

pub use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

use crate::message::{Message, ToolDefinition};

/// The encodings a configuration may name.
pub const ENCODINGS: &[&str] = &["o200k_base", "cl100k_base", "p50k_base", "r50k_base"];

/// The encoding used for models tiktoken does not know.
pub const FALLBACK_ENCODING: &str = "o200k_base";

/// Framing tokens per message (`<|start|>role…<|message|>…<|end|>`).
pub const TOKENS_PER_MESSAGE: usize = 3;

/// Tokens per tool call besides its name and arguments (the call's id, type and framing).
pub const TOKENS_PER_TOOL_CALL: usize = 4;

/// Tokens per tool definition besides its name, description and parameters.
pub const TOKENS_PER_TOOL: usize = 8;

/// Tokens once per request that offers tools (the namespace around the definitions).
pub const TOOLS_OVERHEAD: usize = 12;

/// Tokens once per request: the reply's priming (`<|start|>assistant<|message|>`).
pub const REPLY_PRIMING: usize = 3;

/// Cached counts kept before the cache is cleared.
const CACHE_LIMIT: usize = 10_000;

/// The o200k tokenizer (current OpenAI models'), loaded once per process: what `dataref
/// demo` and the benchmarks measure what a model reads with.
pub fn o200k_base() -> &'static CoreBPE {
    tiktoken_rs::o200k_base_singleton()
}

/// Counts tokens with a model's tokenizer; counts of messages are cached.
pub struct TokenCounter {
    /// Loads the BPE on its first call (then returns the process's one).
    bpe: fn() -> &'static CoreBPE,
    encoding: &'static str,
    approximate: bool,
    cache: Mutex<HashMap<u64, usize>>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("encoding", &self.encoding)
            .field("approximate", &self.approximate)
            .finish_non_exhaustive()
    }
}

fn bpe_of(tokenizer: Tokenizer) -> (fn() -> &'static CoreBPE, &'static str) {
    match tokenizer {
        Tokenizer::O200kBase => (tiktoken_rs::o200k_base_singleton, "o200k_base"),
        Tokenizer::O200kHarmony => (tiktoken_rs::o200k_harmony_singleton, "o200k_harmony"),
        Tokenizer::Cl100kBase => (tiktoken_rs::cl100k_base_singleton, "cl100k_base"),
        Tokenizer::P50kBase => (tiktoken_rs::p50k_base_singleton, "p50k_base"),
        Tokenizer::P50kEdit => (tiktoken_rs::p50k_edit_singleton, "p50k_edit"),
        Tokenizer::R50kBase | Tokenizer::Gpt2 => (tiktoken_rs::r50k_base_singleton, "r50k_base"),
    }
}

fn tokenizer_named(encoding: &str) -> Option<Tokenizer> {
    match encoding {
        "o200k_base" => Some(Tokenizer::O200kBase),
        "o200k_harmony" => Some(Tokenizer::O200kHarmony),
        "cl100k_base" => Some(Tokenizer::Cl100kBase),
        "p50k_base" => Some(Tokenizer::P50kBase),
        "p50k_edit" => Some(Tokenizer::P50kEdit),
        "r50k_base" | "gpt2" => Some(Tokenizer::R50kBase),
        _ => None,
    }
}

impl TokenCounter {
    /// The tokenizer for `model`, or the one `encoding` names (`o200k_base`, `cl100k_base`,
    /// `p50k_base`, `r50k_base`). An unknown `encoding` is an error naming the choices; an
    /// unknown model is counted with `o200k_base` (an approximation, see the module doc).
    pub fn for_model(model: &str, encoding: Option<&str>) -> Result<Self, String> {
        let (tokenizer, approximate) = match encoding.map(str::trim) {
            Some(name) => match tokenizer_named(&name.to_ascii_lowercase()) {
                Some(tokenizer) => (tokenizer, false),
                None => {
                    return Err(format!(
                        "unknown token encoding `{name}`: choose one of {}",
                        ENCODINGS.join(", ")
                    ));
                }
            },
            None => match model_tokenizer(model) {
                Some(tokenizer) => (tokenizer, false),
                None => (Tokenizer::O200kBase, true),
            },
        };
        let (bpe, encoding) = bpe_of(tokenizer);
        Ok(Self {
            bpe,
            encoding,
            approximate,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The encoding's name (`o200k_base`, …).
    pub fn encoding(&self) -> &'static str {
        self.encoding
    }

    /// True when the model is not one tiktoken knows and counts are an approximation.
    pub fn is_approximate(&self) -> bool {
        self.approximate
    }

    /// Tokens of plain text (special-token markers in it count as ordinary text, as a
    /// provider escapes them).
    pub fn count_text(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        (self.bpe)().encode_ordinary(text).len()
    }

    /// A message's tokens as the provider counts them in a request (content, calls and the
    /// per-message overhead); cached.
    pub fn count_message(&self, message: &Message) -> usize {
        let key = message_key(message);
        if let Some(&n) = self.cache().get(&key) {
            return n;
        }
        let n = self.count_message_uncached(message);
        self.remember(key, n);
        n
    }

    /// The counts of `messages`, in order; like [`count_message`](Self::count_message) on
    /// each, with the cache locked once for the cached ones.
    pub fn count_messages(&self, messages: &[Message]) -> Vec<usize> {
        let keys: Vec<u64> = messages.iter().map(message_key).collect();
        let mut counts: Vec<Option<usize>> = {
            let cache = self.cache();
            keys.iter().map(|k| cache.get(k).copied()).collect()
        };
        for (i, slot) in counts.iter_mut().enumerate() {
            if slot.is_none() {
                let n = self.count_message_uncached(&messages[i]);
                self.remember(keys[i], n);
                *slot = Some(n);
            }
        }
        counts.into_iter().map(|c| c.unwrap_or(0)).collect()
    }

    /// The tool definitions as the provider serializes them: name, description and the
    /// JSON of the parameters, a few tokens of framing each, and once for the set; cached.
    pub fn count_tools(&self, tools: &[ToolDefinition]) -> usize {
        if tools.is_empty() {
            return 0;
        }
        let mut total = TOOLS_OVERHEAD;
        for tool in tools {
            let parameters = tool.parameters.to_string();
            let mut hasher = DefaultHasher::new();
            "tool".hash(&mut hasher);
            tool.name.hash(&mut hasher);
            tool.description.hash(&mut hasher);
            parameters.hash(&mut hasher);
            let key = hasher.finish();
            let cached = self.cache().get(&key).copied();
            let n = match cached {
                Some(n) => n,
                None => {
                    let n = TOKENS_PER_TOOL
                        + self.count_text(&tool.name)
                        + self.count_text(&tool.description)
                        + self.count_text(&parameters);
                    self.remember(key, n);
                    n
                }
            };
            total += n;
        }
        total
    }

    /// The byte offsets where the tokens of `text` end, in order (the last is
    /// `text.len()`); an offset may fall inside a multi-byte character.
    pub(crate) fn token_ends(&self, text: &str) -> Vec<usize> {
        let bpe = (self.bpe)();
        let tokens = bpe.encode_ordinary(text);
        let mut ends = Vec::with_capacity(tokens.len());
        let mut at = 0;
        for token in tokens {
            at += bpe.decode_bytes(&[token]).map(|b| b.len()).unwrap_or(0);
            ends.push(at.min(text.len()));
        }
        if let Some(last) = ends.last_mut() {
            *last = text.len();
        }
        ends
    }

    fn count_message_uncached(&self, message: &Message) -> usize {
        let role = match message.role {
            crate::message::Role::System => "system",
            crate::message::Role::User => "user",
            crate::message::Role::Assistant => "assistant",
            crate::message::Role::Tool => "tool",
        };
        let mut n = TOKENS_PER_MESSAGE + self.count_text(role) + self.count_text(&message.content);
        for call in &message.tool_calls {
            n += TOKENS_PER_TOOL_CALL
                + self.count_text(&call.id)
                + self.count_text(&call.name)
                + self.count_text(&call.arguments);
        }
        if let Some(id) = &message.tool_call_id {
            n += self.count_text(id);
        }
        n
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn remember(&self, key: u64, n: usize) {
        let mut cache = self.cache();
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, n);
    }
}

/// tiktoken's tokenizer for a model name, ignoring a provider prefix (`openai/gpt-4o`).
fn model_tokenizer(model: &str) -> Option<Tokenizer> {
    let model = model.trim();
    get_tokenizer(model).or_else(|| {
        let (_, bare) = model.rsplit_once('/')?;
        get_tokenizer(bare)
    })
}

fn message_key(message: &Message) -> u64 {
    let mut hasher = DefaultHasher::new();
    message.role.hash(&mut hasher);
    message.content.hash(&mut hasher);
    message.tool_calls.len().hash(&mut hasher);
    for call in &message.tool_calls {
        call.id.hash(&mut hasher);
        call.name.hash(&mut hasher);
        call.arguments.hash(&mut hasher);
    }
    message.tool_call_id.hash(&mut hasher);
    hasher.finish()
}
