import { describe, expect, it } from 'vitest';
import { renderMarkdown } from './markdown';

/** The rendered HTML as a page would hold it. */
function rendered(text: string): HTMLElement {
  const element = document.createElement('div');
  element.innerHTML = renderMarkdown(text);
  return element;
}

describe('an answer as Markdown', () => {
  it('renders headings, lists, tables and emphasis', () => {
    const page = rendered(
      '## Plan\n\n1. **Boil** water\n2. Add *tea*\n\n- one\n- two\n\n| Step | Minutes |\n|:-----|--------:|\n| steep | 3 |\n',
    );
    expect(page.querySelector('h2')?.textContent).toBe('Plan');
    expect([...page.querySelectorAll('ol > li')].map((li) => li.textContent)).toEqual(['Boil water', 'Add tea']);
    expect(page.querySelector('strong')?.textContent).toBe('Boil');
    expect(page.querySelectorAll('ul > li')).toHaveLength(2);
    expect([...page.querySelectorAll('th')].map((th) => th.textContent)).toEqual(['Step', 'Minutes']);
    // Alignment as a class: the app's pages refuse inline styles.
    const minutes = page.querySelector('td:last-child');
    expect(minutes?.className).toBe('align-right');
    expect(page.querySelector('[style]')).toBeNull();
  });

  it('keeps HTML the model writes as visible text', () => {
    const text = 'Try <script>alert(1)</script> and <img src=x onerror="alert(2)"> here.\n\n<div onclick="x()">block</div>';
    const page = rendered(text);
    expect(page.querySelector('script, img, div')).toBeNull();
    expect(page.querySelector('[onerror], [onclick]')).toBeNull();
    expect(page.textContent).toContain('<script>alert(1)</script>');
    expect(page.textContent).toContain('<img src=x onerror="alert(2)">');
    expect(page.textContent).toContain('<div onclick="x()">block</div>');
  });

  it('never makes a link that runs code, nor loads an image', () => {
    const page = rendered('[click](javascript:alert(1)) [data](data:text/html,<b>x</b>) ![pixel](https://example.com/p.png)');
    expect(page.querySelector('img')).toBeNull();
    // An image is a link to it at most; the other two are not links at all.
    expect([...page.querySelectorAll('a')].map((a) => a.getAttribute('href'))).toEqual(['https://example.com/p.png']);
    expect(page.textContent).toContain('[click](javascript:alert(1))');
    expect(page.textContent).toContain('[data](data:text/html,<b>x</b>)');
    const link = rendered('[docs](https://example.com/docs)').querySelector('a');
    expect(link?.getAttribute('href')).toBe('https://example.com/docs');
    expect(link?.getAttribute('title')).toBe('https://example.com/docs');
    expect(link?.getAttribute('rel')).toBe('noreferrer');
  });

  it('gives every code block a Copy button and escapes the code', () => {
    const page = rendered('```python\nprint("<b>hi</b>")\n```\n\n    indented = 1\n');
    const blocks = page.querySelectorAll('.code-block');
    expect(blocks).toHaveLength(2);
    const [fenced, indented] = [...blocks];
    expect(fenced?.querySelector('button')?.getAttribute('aria-label')).toBe('Copy python code');
    expect(fenced?.querySelector('code')?.textContent).toBe('print("<b>hi</b>")\n');
    expect(fenced?.querySelector('code b')).toBeNull();
    expect(indented?.querySelector('button')?.textContent).toBe('Copy');
    expect(indented?.querySelector('code')?.textContent).toBe('indented = 1\n');
  });

  it('renders an answer cut off inside a code block', () => {
    const page = rendered('Here:\n\n```js\nconst a = 1;');
    expect(page.querySelector('.code-block code')?.textContent).toBe('const a = 1;');
  });
});
