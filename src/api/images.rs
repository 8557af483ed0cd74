//! Images as the dialects send them: a `data:` URL (OpenAI's `image_url`,
//! Responses' `input_image`, Anthropic's base64 source) or bare base64
//! (Ollama's `images`), turned into the base64 of the file that
//! `ChatMessage::images` holds. A URL on the web is refused: a local server
//! must not fetch what a web page names on the user's behalf.

use super::error::ApiError;

/// The base64 of the image a `data:` URL holds; `what` names the field in
/// errors.
pub(super) fn from_url(url: &str, what: &str) -> Result<String, ApiError> {
    let url = url.trim();
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::InvalidField(format!(
            "{what} is a web address; this server does not fetch images, so send the file \
             itself as a data: URL (data:image/png;base64,...)"
        )));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ApiError::InvalidField(format!(
            "{what} is not a data: URL; send the image as data:image/png;base64,..."
        )));
    };
    let Some((kind, data)) = rest.split_once(',') else {
        return Err(ApiError::InvalidField(format!(
            "{what} is a data: URL without data"
        )));
    };
    if !kind.ends_with(";base64") {
        return Err(ApiError::InvalidField(format!(
            "{what} is a data: URL that is not base64; encode the image in base64"
        )));
    }
    from_base64(data, what)
}

/// `data` checked to be base64 (the bytes are an image or not when the
/// engine decodes them, which names the format). The check reads the
/// text without decoding it, so a large upload costs one pass over it.
pub(super) fn from_base64(data: &str, what: &str) -> Result<String, ApiError> {
    let data = data.trim();
    let body = data.trim_end_matches('=');
    let valid = data.len().is_multiple_of(4)
        && data.len() - body.len() <= 2
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !valid {
        return Err(ApiError::InvalidField(format!(
            "{what} is not valid base64; send the file's bytes in standard base64 (A-Z, a-z, \
             0-9, + and /, padded with =)"
        )));
    }
    Ok(data.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_url_gives_its_base64_and_a_web_address_is_refused() {
        assert_eq!(from_url("data:image/png;base64,aGk=", "x").unwrap(), "aGk=");
        let refused = |url: &str| match from_url(url, "image_url") {
            Err(ApiError::InvalidField(message)) => message,
            other => panic!("{url}: {other:?}"),
        };
        assert!(refused("https://example.com/cat.png").contains("does not fetch"));
        assert!(refused("file:///etc/passwd").contains("not a data: URL"));
        assert!(refused("data:image/png,rawbytes").contains("not base64"));
        assert!(refused("data:image/png;base64,@@@").contains("not valid base64"));
    }
}
