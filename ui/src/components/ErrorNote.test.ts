import { cleanup, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it } from 'vitest';
import { ERROR_KINDS, toCommandError, type ErrorKind } from '../lib/backend';
import ErrorNote, { ERROR_WORDS } from './ErrorNote.svelte';

afterEach(cleanup);

/** What the app must not say: the CLI's commands and flags, or source files. */
const OUT_OF_PLACE = [/\bondo [a-z]/, /(^|[\s(`'"])--[a-z]/, /\.(cpp|c|h|mm|rs):\d/, /\/rustc\//, /\bHF_[A-Z_]+/];

describe('ErrorNote', () => {
  // ERROR_KINDS is generated from the Rust enum, so this walks every kind
  // the backend can send.
  it.each(ERROR_KINDS.map((kind) => [kind]))('gives %s its own headline', (kind: ErrorKind) => {
    render(ErrorNote, { error: { kind, message: `what happened (${kind})` } });
    const note = screen.getByRole('alert');
    expect(note.dataset.kind).toBe(kind);
    expect(note.querySelector('.headline')?.textContent).toBe(ERROR_WORDS[kind].headline);
    expect(note.textContent).toContain(`what happened (${kind})`);
    const advice = ERROR_WORDS[kind].advice;
    if (advice) expect(note.querySelector('.advice')?.textContent).toBe(advice);
    else expect(note.querySelector('.advice')).toBeNull();
  });

  it('never says the same headline for two kinds', () => {
    const owners = new Map<string, ErrorKind>();
    for (const kind of ERROR_KINDS) {
      const headline = ERROR_WORDS[kind].headline;
      expect(owners.get(headline), `"${headline}"`).toBeUndefined();
      owners.set(headline, kind);
    }
  });

  it('names buttons and settings, never a command-line flag, command or variable', () => {
    for (const kind of ERROR_KINDS) {
      const { headline, advice } = ERROR_WORDS[kind];
      for (const words of [headline, advice ?? '']) {
        for (const pattern of OUT_OF_PLACE) expect(words, kind).not.toMatch(pattern);
      }
    }
  });

  it('shows a failure that is not a command error as an internal one', () => {
    render(ErrorNote, { error: toCommandError(new Error('invalid args `format` for command `export_runs`')) });
    const note = screen.getByRole('alert');
    expect(note.dataset.kind).toBe('internal');
    expect(note.querySelector('.headline')?.textContent).toBe('Something went wrong inside Ondo');
  });

  it('treats a kind the app does not know as an internal failure, keeping its message', () => {
    const error = toCommandError({ kind: 'from_a_newer_ondo', message: 'the new thing failed' });
    expect(error).toEqual({ kind: 'internal', message: 'the new thing failed' });
  });
});
