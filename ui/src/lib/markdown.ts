// An answer's Markdown as HTML for the chat: headings, lists, tables,
// emphasis and code blocks, and nothing the model could use to run code or
// reach the network. markdown-it with `html: false` escapes every tag the
// model writes, so a `<script>` or an `onerror=` stays visible text; links
// whose scheme could run code are left as text by markdown-it itself, and
// images are not rendered at all (loading one would tell a server what the
// conversation is about). Code blocks get a Copy button that the page wires.
import MarkdownIt from 'markdown-it';

/** The class of a code block's wrapper; its button copies the `code` inside. */
export const CODE_BLOCK_CLASS = 'code-block';
/** The class of the Copy button in each code block. */
export const COPY_CODE_CLASS = 'copy-code';

const markdown = new MarkdownIt({ html: false, linkify: false, typographer: false });
markdown.disable(['image']);

const renderRules = markdown.renderer.rules;
const defaultFence = renderRules.fence;
const defaultCodeBlock = renderRules.code_block;

/** Wraps a rendered `<pre>` with the Copy button. */
function withCopyButton(pre: string, language: string): string {
  const label = language ? `Copy ${markdown.utils.escapeHtml(language)} code` : 'Copy code';
  return (
    `<div class="${CODE_BLOCK_CLASS}">` +
    `<button type="button" class="${COPY_CODE_CLASS}" aria-label="${label}">Copy</button>` +
    `${pre}</div>`
  );
}

renderRules.fence = (tokens, index, options, env, self) => {
  const pre = defaultFence ? defaultFence(tokens, index, options, env, self) : '';
  const language = tokens[index]?.info.trim().split(/\s+/)[0] ?? '';
  return withCopyButton(pre, language);
};

renderRules.code_block = (tokens, index, options, env, self) =>
  withCopyButton(defaultCodeBlock ? defaultCodeBlock(tokens, index, options, env, self) : '', '');

// The app's pages allow no inline styles, so a table column's alignment is
// a class (`align-left`, `align-center`, `align-right`) instead.
for (const cell of ['th_open', 'td_open'] as const) {
  renderRules[cell] = (tokens, index, options, _env, self) => {
    const token = tokens[index];
    const style = token?.attrGet('style');
    if (token && style) {
      token.attrs = (token.attrs ?? []).filter(([name]) => name !== 'style');
      const align = /text-align:\s*(left|center|right)/.exec(String(style))?.[1];
      if (align) token.attrJoin('class', `align-${align}`);
    }
    return self.renderToken(tokens, index, options);
  };
}

// Links open nothing inside the popover (the page handles clicks); the
// address shows on hover, and no referrer would go with it anyway.
const defaultLinkOpen = renderRules.link_open;
renderRules.link_open = (tokens, index, options, env, self) => {
  const token = tokens[index];
  if (token) {
    const href = token.attrGet('href');
    if (href) token.attrSet('title', href);
    token.attrSet('rel', 'noreferrer');
  }
  return defaultLinkOpen ? defaultLinkOpen(tokens, index, options, env, self) : self.renderToken(tokens, index, options);
};

/** The answer's Markdown as safe HTML. */
export function renderMarkdown(text: string): string {
  return markdown.render(text);
}
