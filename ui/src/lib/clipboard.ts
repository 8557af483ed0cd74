// Copying text for the user (the server's address, a curl example). The
// web platform's clipboard works in the app's webviews (WKWebView, and
// WebKitGTK for the custom protocol the pages load from), so no plugin is
// needed; where a page cannot use it (an insecure context), the older
// copy command on a selected text area does the same.

/** Copies `text`; rejects when neither way is allowed. */
export async function copyText(text: string): Promise<void> {
  if (navigator.clipboard?.writeText) {
    try {
      await navigator.clipboard.writeText(text);
      return;
    } catch {
      // Refused (no user gesture reached it): try the older way.
    }
  }
  const area = document.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.style.position = 'fixed';
  area.style.opacity = '0';
  document.body.appendChild(area);
  const focused = document.activeElement as HTMLElement | null;
  area.select();
  try {
    if (!document.execCommand?.('copy')) throw new Error('copying is not allowed here');
  } finally {
    area.remove();
    focused?.focus();
  }
}
