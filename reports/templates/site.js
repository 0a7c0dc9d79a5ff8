// Parity dashboard behaviour, inlined into index.html: the matrix filter (text, tier, disagreements only,
// not passing everywhere only) and its state in the URL hash, so a filtered view can be linked to.
(function () {
  "use strict";
  var table = document.getElementById("matrix-table");
  var q = document.getElementById("q");
  var tier = document.getElementById("tier");
  var onlyDisagree = document.getElementById("only-disagree");
  var onlyBroken = document.getElementById("only-broken");
  var shown = document.getElementById("shown");
  if (!table || !q) { document.body.setAttribute("data-ready", "1"); return; }
  var rows = Array.prototype.slice.call(table.tBodies[0].rows);
  var total = rows.length;

  function readHash() {
    var params = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    if (params.has("q")) { q.value = params.get("q"); }
    if (params.has("tier")) { tier.value = params.get("tier"); }
    onlyDisagree.checked = params.get("disagree") === "1";
    onlyBroken.checked = params.get("broken") === "1";
  }

  function writeHash() {
    var params = new URLSearchParams();
    if (q.value) { params.set("q", q.value); }
    if (tier.value) { params.set("tier", tier.value); }
    if (onlyDisagree.checked) { params.set("disagree", "1"); }
    if (onlyBroken.checked) { params.set("broken", "1"); }
    var text = params.toString();
    // replaceState: filtering must not scroll the page to an anchor or fill the history.
    history.replaceState(null, "", text ? "#" + text : window.location.pathname);
  }

  var failures = document.getElementById("failures-table");
  var failureRows = failures ? Array.prototype.slice.call(failures.tBodies[0].rows) : [];

  function apply() {
    var needle = q.value.trim().toLowerCase();
    var visible = 0;
    rows.forEach(function (row) {
      var ok = (!needle || row.getAttribute("data-text").indexOf(needle) !== -1) &&
        (!tier.value || row.getAttribute("data-tier") === tier.value) &&
        (!onlyDisagree.checked || row.getAttribute("data-disagree") === "1") &&
        (!onlyBroken.checked || row.getAttribute("data-everywhere") === "no");
      row.hidden = !ok;
      if (ok) { visible += 1; }
    });
    shown.textContent = visible + " of " + total + " checks shown";
    table.setAttribute("data-visible", String(visible));
    // The text filter also narrows the failures list, so one search finds a check everywhere.
    failureRows.forEach(function (row) {
      row.hidden = needle !== "" && row.getAttribute("data-text").indexOf(needle) === -1;
    });
  }

  function onChange() { apply(); writeHash(); }
  [q, tier, onlyDisagree, onlyBroken].forEach(function (el) {
    el.addEventListener(el === q ? "input" : "change", onChange);
  });
  window.addEventListener("hashchange", function () { readHash(); apply(); });

  readHash();
  apply();
  document.body.setAttribute("data-ready", "1");
  // The browser test reads this line to know the console is being captured (and has no errors).
  console.info("dashboard ready: " + total + " checks");
})();
