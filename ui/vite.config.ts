// Vite builds the popover into ui/dist for the Tauri shell; Vitest runs the
// unit and component tests in jsdom.
import { svelte } from '@sveltejs/vite-plugin-svelte';
import { svelteTesting } from '@testing-library/svelte/vite';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  plugins: [svelte(), svelteTesting()],
  // Tauri serves ui/dist from its own protocol: relative asset URLs work there.
  base: './',
  clearScreen: false,
  server: {
    port: 5173,
    strictPort: true,
    host: '127.0.0.1',
  },
  build: {
    // WebKitGTK 2.4x on Linux and Safari 16 on macOS 13.
    target: ['es2022', 'safari16'],
    outDir: 'dist',
    emptyOutDir: true,
  },
  test: {
    environment: 'jsdom',
    include: ['src/**/*.test.ts'],
  },
});
