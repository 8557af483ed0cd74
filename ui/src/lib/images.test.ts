import { describe, expect, it } from 'vitest';
import {
  base64OfDataUrl,
  dragHasFiles,
  filesOf,
  IMAGE_ACCEPT,
  imageAlt,
  imageRefusal,
  imageTypeOf,
  MAX_IMAGE_BYTES,
  readImage,
  textOnlyNote,
} from './images';

const MiB = 1024 * 1024;

/** What `imageRefusal` reads of a file: never its bytes. */
const described = (name: string, type: string, size: number) => ({ name, type, size });

describe('image helpers', () => {
  it('takes the base64 out of a data: URL, and leaves bare base64 alone', () => {
    expect(base64OfDataUrl('data:image/png;base64,iVBORw0KGgo=')).toBe('iVBORw0KGgo=');
    expect(base64OfDataUrl('data:image/jpeg;name=a.jpg;base64,/9j/4AAQ')).toBe('/9j/4AAQ');
    expect(base64OfDataUrl('DATA:image/gif;BASE64,R0lGOD')).toBe('R0lGOD');
    expect(base64OfDataUrl('iVBORw0KGgo=')).toBe('iVBORw0KGgo=');
    expect(base64OfDataUrl('')).toBe('');
  });

  it('accepts the four types the engine decodes, by type or else by extension', () => {
    expect(IMAGE_ACCEPT).toBe('image/png,image/jpeg,image/webp,image/gif');
    expect(imageTypeOf({ name: 'a.png', type: 'image/png' })).toBe('image/png');
    expect(imageTypeOf({ name: 'photo', type: 'image/jpeg' })).toBe('image/jpeg');
    expect(imageTypeOf({ name: 'drawing.svg', type: 'image/svg+xml' })).toBeNull();
    expect(imageTypeOf({ name: 'scan.heic', type: 'image/heic' })).toBeNull();
    // A named type wins over the extension.
    expect(imageTypeOf({ name: 'not-really.png', type: 'application/pdf' })).toBeNull();
    expect(imageTypeOf({ name: 'Shot.JPG', type: '' })).toBe('image/jpeg');
    expect(imageTypeOf({ name: 'loop.gif', type: '' })).toBe('image/gif');
    expect(imageTypeOf({ name: 'README', type: '' })).toBeNull();
  });

  it('takes HEIC only where the engine decodes it (a Mac)', () => {
    expect(imageTypeOf({ name: 'IMG_0001.HEIC', type: 'image/heic' }, true)).toBe('image/heic');
    expect(imageTypeOf({ name: 'IMG_0001.heic', type: '' }, true)).toBe('image/heic');
    expect(imageTypeOf({ name: 'IMG_0001.heic', type: '' }, false)).toBeNull();
    expect(imageRefusal(described('IMG_0001.heic', 'image/heic', 1000), true)).toBeNull();
    expect(imageRefusal(described('IMG_0001.heic', 'image/heic', 1000), false)).toBe(
      'IMG_0001.heic is not a PNG, JPEG, WebP or GIF image; it was left out',
    );
    expect(imageRefusal(described('report.pdf', 'application/pdf', 1000), true)).toBe(
      'report.pdf is not a PNG, JPEG, WebP, GIF or HEIC image; it was left out',
    );
  });

  it('refuses a file over 20 MiB, and a file that is not an image, from its name, type and size', () => {
    expect(MAX_IMAGE_BYTES).toBe(20 * MiB);
    expect(imageRefusal(described('ok.png', 'image/png', 20 * MiB))).toBeNull();
    expect(imageRefusal(described('big.webp', 'image/webp', 20 * MiB + 1))).toBe(
      'big.webp is over 20 MiB; send a smaller image',
    );
    expect(imageRefusal(described('report.pdf', 'application/pdf', 1000))).toBe(
      'report.pdf is not a PNG, JPEG, WebP or GIF image; it was left out',
    );
  });

  it('finds the files of a drop or a paste in its file list, or else its file items', () => {
    const a = new File(['a'], 'a.png', { type: 'image/png' });
    const b = new File(['b'], 'b.png', { type: 'image/png' });
    const list = (files: File[]) => Object.assign([...files], { item: (i: number) => files[i] ?? null }) as unknown as FileList;
    const item = (kind: string, file: File | null) => ({ kind, type: file?.type ?? 'text/plain', getAsFile: () => file });
    const items = (entries: ReturnType<typeof item>[]) => entries as unknown as DataTransferItemList;
    expect(filesOf({ files: list([a, b]), items: items([]) })).toEqual([a, b]);
    expect(filesOf({ files: list([]), items: items([item('string', null), item('file', b)]) })).toEqual([b]);
    expect(filesOf({ files: list([]), items: items([item('string', null)]) })).toEqual([]);
    expect(filesOf(null)).toEqual([]);
    expect(dragHasFiles({ types: ['text/plain', 'Files'] })).toBe(true);
    expect(dragHasFiles({ types: ['text/plain'] })).toBe(false);
    expect(dragHasFiles(null)).toBe(false);
  });

  it('reads a file into its data: URL and its bare base64', async () => {
    const png = new File([new Uint8Array([0x89, 0x50, 0x4e, 0x47])], 'cat.png', { type: 'image/png' });
    expect(await readImage(png)).toEqual({
      name: 'cat.png',
      dataUrl: 'data:image/png;base64,iVBORw==',
      base64: 'iVBORw==',
    });
    // No type given: the thumbnail's URL still names the image type.
    const untyped = new File([new Uint8Array([0xff, 0xd8, 0xff])], 'photo.jpg');
    expect(await readImage(untyped)).toEqual({ name: 'photo.jpg', dataUrl: 'data:image/jpeg;base64,/9j/', base64: '/9j/' });
  });

  it('names a thumbnail by its file, and its place where the message has several', () => {
    expect(imageAlt('cat.png', 0, 1)).toBe('cat.png');
    expect(imageAlt('dog.png', 1, 2)).toBe('dog.png, image 2 of 2');
  });

  it('says when a model reads text only, for attached images and for images earlier in the conversation', () => {
    expect(textOnlyNote(true, 1, true)).toBeNull();
    expect(textOnlyNote(undefined, 1, true)).toBeNull();
    expect(textOnlyNote(false, 0, false)).toBeNull();
    expect(textOnlyNote(false, 2, false)).toBe(
      'This model reads text only; choose a model that sees images (Gemma 3 4B and larger, or Qwen3-VL), or remove the image.',
    );
    expect(textOnlyNote(false, 0, true)).toBe(
      'This model reads text only and this conversation has images; choose a model that sees images (Gemma 3 4B and larger, or Qwen3-VL), or start a new conversation.',
    );
  });
});
