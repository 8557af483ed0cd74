//! Images as the dialects send them: a `data:` URL (OpenAI's `image_url`,
//! Responses' `input_image`, Anthropic's base64 source) or bare base64
//! (Ollama's `images`), turned into the base64 of the file that
//! `ChatMessage::images` holds. A URL on the web is refused: a local server
//! must not fetch what a web page names on the user's behalf.

use super::error::ApiError;

/// The base64 of the image a `data:` URL holds; `what` names the field in
/// errors. The URL's own text becomes the base64's (moved, not copied: an
/// upload may be tens of megabytes).
pub(super) fn from_url(mut url: String, what: &str) -> Result<String, ApiError> {
    let leading = url.len() - url.trim_start().len();
    let trimmed = url.trim();
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        return Err(ApiError::InvalidField(format!(
            "{what} is a web address; this server does not fetch images, so send the file \
             itself as a data: URL (data:image/png;base64,...)"
        )));
    }
    let Some(rest) = trimmed.strip_prefix("data:") else {
        return Err(ApiError::InvalidField(format!(
            "{what} is not a data: URL; send the image as data:image/png;base64,..."
        )));
    };
    let Some((kind, _)) = rest.split_once(',') else {
        return Err(ApiError::InvalidField(format!(
            "{what} is a data: URL without data"
        )));
    };
    if !kind.ends_with(";base64") {
        return Err(ApiError::InvalidField(format!(
            "{what} is a data: URL that is not base64; encode the image in base64"
        )));
    }
    let data_starts = leading + "data:".len() + kind.len() + 1;
    url.drain(..data_starts);
    from_base64(url, what)
}

/// `data` checked to be base64 (the bytes are an image or not when the
/// engine decodes them, which names the format), trimmed in place. The
/// check reads the text without decoding it, so a large upload costs one
/// quick pass over it.
pub(super) fn from_base64(mut data: String, what: &str) -> Result<String, ApiError> {
    data.truncate(data.trim_end().len());
    let leading = data.len() - data.trim_start().len();
    data.drain(..leading);
    let body = data.trim_end_matches('=').len();
    let valid = data.len().is_multiple_of(4)
        && data.len() - body <= 2
        && is_base64_alphabet(&data.as_bytes()[..body]);
    if !valid {
        return Err(ApiError::InvalidField(format!(
            "{what} is not valid base64; send the file's bytes in standard base64 (A-Z, a-z, \
             0-9, + and /, padded with =)"
        )));
    }
    Ok(data)
}

/// Whether every byte is of base64's alphabet (A-Z, a-z, 0-9, + and /):
/// 64 bytes at a time with no branch inside, which the compiler turns into
/// vector instructions (a byte-by-byte test with an early exit took tens
/// of milliseconds for a 50 MB upload).
fn is_base64_alphabet(bytes: &[u8]) -> bool {
    bytes.chunks(64).all(|chunk| {
        chunk.iter().fold(0u8, |bad, &c| {
            let ok = (c.wrapping_sub(b'A') < 26)
                | (c.wrapping_sub(b'a') < 26)
                | (c.wrapping_sub(b'0') < 10)
                | (c == b'+')
                | (c == b'/');
            bad | u8::from(!ok)
        }) == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_url_gives_its_base64_and_a_web_address_is_refused() {
        assert_eq!(
            from_url("data:image/png;base64,aGk=".into(), "x").unwrap(),
            "aGk="
        );
        assert_eq!(
            from_url(" data:image/png;base64,aGk= \n".into(), "x").unwrap(),
            "aGk="
        );
        assert_eq!(from_base64("  aGk=\n".into(), "x").unwrap(), "aGk=");
        let long: String = "QUJD".repeat(1000) + "aGk=";
        assert_eq!(from_base64(long.clone(), "x").unwrap(), long);
        let bad_late = "QUJD".repeat(1000) + "a-k=";
        assert!(from_base64(bad_late, "x").is_err());
        let refused = |url: &str| match from_url(url.into(), "image_url") {
            Err(ApiError::InvalidField(message)) => message,
            other => panic!("{url}: {other:?}"),
        };
        assert!(refused("https://example.com/cat.png").contains("does not fetch"));
        assert!(refused("file:///etc/passwd").contains("not a data: URL"));
        assert!(refused("data:image/png,rawbytes").contains("not base64"));
        assert!(refused("data:image/png;base64,@@@").contains("not valid base64"));
    }
}
