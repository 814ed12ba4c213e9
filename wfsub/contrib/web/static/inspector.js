// wfsub inspector: follows the server-sent events of the page's live region and swaps it when it changes,
// then draws its workflow (Mermaid, shipped beside this file). No framework, no build step.
(function () {
  "use strict";
  var region = document.getElementById("live");
  var dot = document.getElementById("live-dot");

  function draw(root) {
    if (!window.mermaid) return;
    var nodes = root.querySelectorAll("pre.mermaid:not([data-processed])");
    if (!nodes.length) return;
    window.mermaid.run({ nodes: nodes }).then(function () {
      document.body.setAttribute("data-drawn", String(Date.now()));
    }).catch(function (err) {
      for (var i = 0; i < nodes.length; i++) nodes[i].setAttribute("data-error", String(err));
    });
  }

  if (window.mermaid) {
    // Mermaid's own limits (500 edges, 50,000 characters) refuse workflows of a few hundred steps; to_mermaid
    // draws up to 100,000 nodes (about 2 edges and 120 characters each), so the limits are raised past that.
    window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral",
                                flowchart: { htmlLabels: false }, maxEdges: 1000000, maxTextSize: 100000000 });
    draw(document);
  }
  if (!region || !region.getAttribute("data-live") || !window.EventSource) return;

  var source = new EventSource(region.getAttribute("data-live"));
  var updates = 0;
  source.onopen = function () { if (dot) dot.classList.add("on"); };
  source.onerror = function () { if (dot) dot.classList.remove("on"); };
  source.addEventListener("update", function (event) {
    var open = {};  // keep the <details> the reader opened
    region.querySelectorAll("details[open]").forEach(function (d, i) { open[i] = true; });
    var fresh = document.createElement("template");
    fresh.innerHTML = event.data;  // escaped by the server's templates: text from a case is never markup
    region.replaceChildren(fresh.content);
    region.querySelectorAll("details").forEach(function (d, i) { if (open[i]) d.open = true; });
    updates += 1;
    region.setAttribute("data-updates", String(updates));
    draw(region);
  });
})();
