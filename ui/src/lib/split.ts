import type { SplitStatus } from './backend';

/** The machines as the form gives them: one a line (or separated by
 * spaces or commas, which no host name has), blanks left out. */
export function splitHosts(text: string): string[] {
  return text.split(/[\s,]+/).filter((host) => host !== '');
}

/** "by layers" or "by heads". */
function how(status: SplitStatus): string {
  return status.ask.split === 'tensor' ? 'by heads' : 'by layers';
}

/**
 * One line for the split's state: starting (with what the machines said
 * last), serving, lost or ended.
 */
export function splitHeadline(status: SplitStatus): string {
  const what = `${status.ask.model} ${how(status)} over ${status.ask.hosts.length} machines (${status.ask.hosts.join(', ')})`;
  switch (status.state.state) {
    case 'starting': {
      const last = status.lines[status.lines.length - 1];
      return `Starting ${what}${last ? `: ${last}` : '…'}`;
    }
    case 'serving':
      return `Serving ${what}: pick it in Chat`;
    case 'lost':
      return `Lost ${what}`;
    case 'ended':
      return `Ended ${what}`;
  }
}

/** The chat's label for the split model. */
export function splitModelLabel(status: SplitStatus): string {
  return `${status.ask.model} (split ${how(status)} over ${status.ask.hosts.length} machines)`;
}
