// Svelte compiler options, read by the Vite plugin and svelte-check.
import { vitePreprocess } from '@sveltejs/vite-plugin-svelte';

export default {
  preprocess: vitePreprocess(),
};
