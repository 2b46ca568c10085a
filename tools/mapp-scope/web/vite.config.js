// MegaScope's UI build. Output: a folder of static files mapp-scope serves
// (CMake passes MAPP_SCOPE_WEB_OUT, build/share/mapp-scope/web). Relative
// asset URLs, no inline scripts or styles (mapp-scope's CSP allows 'self'
// only), no source maps shipped.
import { defineConfig } from 'vite';

export default defineConfig({
  base: './',
  build: {
    outDir: process.env.MAPP_SCOPE_WEB_OUT || 'dist',
    emptyOutDir: true,
    sourcemap: false,
    // Vite's module-preload polyfill would be an inline script.
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 1500,
  },
});
