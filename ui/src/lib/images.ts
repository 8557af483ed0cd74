// Images attached to a chat message: which files the chat takes, how large,
// and the two forms each one keeps — a data: URL for its thumbnail (the
// popover's CSP lets images load from data: URLs, not from blob: URLs) and
// the bare base64 that `ChatMessage.images` carries to the shell.

/** The image types the engine decodes everywhere. */
export const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'] as const;
/** HEIC, which the engine decodes through macOS's own decoder: on a Mac only. */
export const HEIC_TYPES = ['image/heic', 'image/heif'] as const;
export type ImageType = (typeof IMAGE_TYPES)[number] | (typeof HEIC_TYPES)[number];

/** Whether this is a Mac, whose engine reads HEIC. */
export const DECODES_HEIC = typeof navigator !== 'undefined' && /Mac/.test(navigator.userAgent);

/** The types a chat takes here, as the file picker's `accept` lists them. */
export function acceptedTypes(heic: boolean = DECODES_HEIC): readonly ImageType[] {
  return heic ? [...IMAGE_TYPES, ...HEIC_TYPES] : IMAGE_TYPES;
}
export const IMAGE_ACCEPT = acceptedTypes().join(',');

/** The largest file the chat reads (bytes): the shell's default limit, so a
 * file the shell would refuse is refused before it is read into memory. The
 * shell checks its own limits (bytes and pixels) again and names them. */
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024;

/** The models whose answers can take images, as the notes name them. */
export const MODELS_THAT_SEE_IMAGES = 'Gemma 3 4B and larger, or Qwen3-VL';

/** One image of a message, read from its file. */
export interface ChatImage {
  /** The file's name ("image.png" for most pasted images). */
  name: string;
  /** `data:TYPE;base64,…`, what the thumbnail shows. */
  dataUrl: string;
  /** The whole file in standard base64, without the `data:` prefix. */
  base64: string;
}

/** The part of a `data:…;base64,` URL after its comma; a string that is not
 * such a URL is taken as bare base64 already and comes back unchanged. */
export function base64OfDataUrl(url: string): string {
  const prefix = /^data:[^,]*;base64,/i.exec(url);
  return prefix ? url.slice(prefix[0].length) : url;
}

const TYPE_OF_EXTENSION: Record<string, ImageType> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  webp: 'image/webp',
  gif: 'image/gif',
  heic: 'image/heic',
  heif: 'image/heif',
};

/** The file's image type, or null for a file the engine does not decode
 * (HEIC only where `heic`: on a Mac). A file without a type (some drags from
 * other apps) goes by its extension. */
export function imageTypeOf(
  file: Pick<File, 'name' | 'type'>,
  heic: boolean = DECODES_HEIC,
): ImageType | null {
  const accepted: readonly string[] = acceptedTypes(heic);
  const type = file.type.toLowerCase();
  if (type !== '') return accepted.includes(type) ? (type as ImageType) : null;
  const extension = /\.([a-z0-9]+)$/i.exec(file.name)?.[1]?.toLowerCase() ?? '';
  const byExtension = TYPE_OF_EXTENSION[extension];
  return byExtension !== undefined && accepted.includes(byExtension) ? byExtension : null;
}

/** Why the chat will not take the file, in a short note; null when it will.
 * Reads only the file's name, type and size, never its bytes. */
export function imageRefusal(
  file: Pick<File, 'name' | 'type' | 'size'>,
  heic: boolean = DECODES_HEIC,
): string | null {
  if (imageTypeOf(file, heic) === null) {
    const kinds = heic ? 'PNG, JPEG, WebP, GIF or HEIC' : 'PNG, JPEG, WebP or GIF';
    return `${file.name} is not a ${kinds} image; it was left out`;
  }
  if (file.size > MAX_IMAGE_BYTES) {
    return `${file.name} is over ${MAX_IMAGE_BYTES / 1024 / 1024} MiB; send a smaller image`;
  }
  return null;
}

/** The files a paste or a drop carries: its file list, or where that is empty
 * (some pastes fill only the items), the items that are files. */
export function filesOf(transfer: Pick<DataTransfer, 'files' | 'items'> | null | undefined): File[] {
  if (!transfer) return [];
  if (transfer.files && transfer.files.length > 0) return Array.from(transfer.files);
  const files: File[] = [];
  for (const item of Array.from(transfer.items ?? [])) {
    if (item.kind !== 'file') continue;
    const file = item.getAsFile();
    if (file) files.push(file);
  }
  return files;
}

/** Whether a drag carries files (its items cannot be read until the drop). */
export function dragHasFiles(transfer: Pick<DataTransfer, 'types'> | null | undefined): boolean {
  return Array.from(transfer?.types ?? []).includes('Files');
}

/** Reads an accepted file (see `imageRefusal`) into its two forms. */
export function readImage(file: File): Promise<ChatImage> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const base64 = base64OfDataUrl(String(reader.result));
      // The type from the extension where the file had none, so the
      // thumbnail's data: URL names an image type.
      const type = imageTypeOf(file) ?? file.type;
      resolve({ name: file.name, dataUrl: `data:${type};base64,${base64}`, base64 });
    };
    reader.onerror = () => reject(reader.error ?? new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
}

/** A thumbnail's alt text: the file's name, and where the message has
 * several images, which one it is ("cat.png, image 1 of 2"). */
export function imageAlt(name: string, index: number, count: number): string {
  return count > 1 ? `${name}, image ${index + 1} of ${count}` : name;
}

/** What the compose area says when images meet a model that reads text only
 * (`seesImages` false); null when they can be sent. Unknown features
 * (`undefined`) say nothing: the shell then names what is wrong. */
export function textOnlyNote(
  seesImages: boolean | undefined,
  attached: number,
  historyHasImages: boolean,
): string | null {
  if (seesImages !== false) return null;
  const choose = `choose a model that sees images (${MODELS_THAT_SEE_IMAGES})`;
  if (attached > 0) return `This model reads text only; ${choose}, or remove the image.`;
  if (historyHasImages) return `This model reads text only and this conversation has images; ${choose}, or start a new conversation.`;
  return null;
}
