//! `TextTokenizer`: the byte-level BPE tokenizer of a GGUF file (`tokenizer.ggml.model` =
//! `gpt2`), built from the file's own vocabulary and merges with the `tokenizers` crate: digits
//! split one by one, then GPT-2's byte-level pre-tokenizer, as SmolLM2's tokenizer does;
//! control tokens (`<|im_start|>`, ...) are special tokens. A chat prompt is the file's own
//! chat template (`tokenizer.chat_template`, Jinja, rendered with `minijinja`) where it has one.

use candle_core::quantized::gguf_file::Content;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::{ModelError, Result};

/// GGUF's token type of a control token.
const CONTROL: i32 = 3;

/// Text to token ids and back.
pub struct TextTokenizer {
    inner: Tokenizer,
    eos: u32,
    vocab: usize,
    /// The file's chat template, if it has one.
    chat_template: Option<String>,
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

impl TextTokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(c: &Content) -> Result<Self> {
        let get =
            |k: &str| c.metadata.get(k).ok_or_else(|| ModelError::invalid(k, "missing", "the tokenizer needs it"));
        let model = get("tokenizer.ggml.model")?.to_string()?;
        if model != "gpt2" {
            return Err(ModelError::invalid("tokenizer.ggml.model", model, "only byte-level BPE (gpt2) is supported"));
        }
        let tokens: Vec<String> = get("tokenizer.ggml.tokens")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<_, _>>()?;
        let merges: Vec<(String, String)> = get("tokenizer.ggml.merges")?
            .to_vec()?
            .iter()
            .map(|v| {
                let m = v.to_string()?;
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| candle_core::Error::Msg(format!("merge {m:?} is not two tokens")))
            })
            .collect::<std::result::Result<_, _>>()?;
        let types: Vec<i32> = match c.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v.to_vec()?.iter().map(|t| t.to_i32()).collect::<std::result::Result<_, _>>()?,
            None => Vec::new(),
        };
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        if vocab.len() != tokens.len() {
            return Err(ModelError::invalid("tokenizer.ggml.tokens", tokens.len(), "holds a token twice"));
        }
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(tok_err)?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        inner.with_decoder(Some(ByteLevel::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == CONTROL)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner.add_special_tokens(&special);
        let eos = match c.metadata.get("tokenizer.ggml.eos_token_id") {
            Some(v) => v.to_u32()?,
            None => 0,
        };
        let chat_template = match c.metadata.get("tokenizer.chat_template") {
            Some(v) => Some(v.to_string()?.clone()),
            None => None,
        };
        Ok(Self { inner, eos, vocab: tokens.len(), chat_template })
    }

    /// Token ids of `text` (special tokens written in it are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, false).map_err(tok_err)?.get_ids().to_vec())
    }

    /// The text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The chat prompt of one user message, ready for the assistant's answer: the file's own
    /// chat template (its default system prompt included), else plain ChatML.
    pub fn chat_prompt(&self, user: &str) -> Result<String> {
        match &self.chat_template {
            Some(t) => render_chat(t, user, &self.decode(&[self.eos])?),
            None => Ok(format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")),
        }
    }

    /// The file's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// `template` rendered for one user message with the generation prompt (the variables Hugging
/// Face's templates read: `messages`, `add_generation_prompt`, `eos_token`).
fn render_chat(template: &str, user: &str, eos: &str) -> Result<String> {
    let bad = |e: minijinja::Error| ModelError::invalid("tokenizer.chat_template", "(the file's)", e.to_string());
    let mut env = minijinja::Environment::new();
    env.add_template("chat", template).map_err(bad)?;
    let ctx = minijinja::context! {
        messages => vec![minijinja::context! { role => "user", content => user }],
        add_generation_prompt => true,
        eos_token => eos,
    };
    env.get_template("chat").and_then(|t| t.render(ctx)).map_err(bad)
}

#[cfg(test)]
mod chat_tests {
    use super::render_chat;

    /// SmolLM2-Instruct's template, as its GGUF file carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn the_files_template_renders_its_default_system_prompt() {
        let p = render_chat(SMOLLM2, "Name three primary colors.", "<|im_end|>").unwrap();
        assert_eq!(
            p,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n"
        );
        let e = render_chat("{% for %}", "hi", "").unwrap_err().to_string();
        assert!(e.contains("tokenizer.chat_template"), "{e}");
    }
}
