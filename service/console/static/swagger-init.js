// Swagger UI for this service, from the package's own copy (no CDN).
// The spec is read relative to this page and its server set to the page's own base,
// so "Try it out" calls this service whether it is served at / or under a prefix.
(async () => {
  "use strict";
  const base = new URL(".", location.href);
  const root = base.href.replace(/\/$/, "");
  const response = await fetch(new URL("openapi.json", base));
  const spec = await response.json();
  spec.servers = [{ url: root, description: "this service" }];
  window.ui = SwaggerUIBundle({
    spec,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    validatorUrl: null, // the public validator is not reachable offline; nor should it be asked
    oauth2RedirectUrl: new URL("docs/oauth2-redirect", base).href,
  });
})();
