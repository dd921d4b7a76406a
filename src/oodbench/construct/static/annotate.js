// Keyboard shortcuts and small conveniences for the verdict form; the pages work without them.
(function () {
  "use strict";
  function $(id) { return document.getElementById(id); }

  function choose(verdict, focusId) {
    var radio = $("v-" + verdict);
    if (!radio) { return; }
    radio.checked = true;
    var field = focusId && $(focusId);
    if (field) { field.focus(); if (field.select) { field.select(); } }
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
  }

  document.addEventListener("keydown", function (event) {
    var form = $("verdict-form");
    if (!form || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (event.key === "Escape" && typing(event.target)) { event.target.blur(); return; }
    if (typing(event.target)) { return; }
    var key = event.key.toLowerCase();
    if (key === "o") { event.preventDefault(); choose("ood", "label"); }
    else if (key === "i") { event.preventDefault(); choose("id", "class"); }
    else if (key === "a") { event.preventDefault(); choose("ambiguous", "reason"); }
    else if (key === "f") { event.preventDefault(); var fine = $("fine"); if (fine) { fine.checked = !fine.checked; } }
    else if (key === "enter") { event.preventDefault(); form.requestSubmit ? form.requestSubmit() : form.submit(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    // Typing into a field selects its verdict, so the radio cannot be forgotten.
    [["label", "ood"], ["class", "id"], ["reason", "ambiguous"]].forEach(function (pair) {
      var field = $(pair[0]);
      if (field) {
        field.addEventListener(field.tagName === "SELECT" ? "change" : "input", function () { choose(pair[1]); });
      }
    });
    // Buttons in the evidence panels fill in a class or a label.
    document.querySelectorAll("button.pick").forEach(function (button) {
      button.addEventListener("click", function () {
        if (button.dataset.class && $("class")) { $("class").value = button.dataset.class; choose("id", "class"); }
        if (button.dataset.label && $("label")) { $("label").value = button.dataset.label; choose("ood", "label"); }
      });
    });
    var list = $("class-list");
    if (list && window.fetch) {
      fetch("/api/classes", { credentials: "same-origin" }).then(function (r) { return r.ok ? r.json() : []; })
        .then(function (names) {
          var frag = document.createDocumentFragment();
          names.forEach(function (name, index) {
            var option = document.createElement("option");
            option.value = index + ": " + name;
            frag.appendChild(option);
          });
          list.appendChild(frag);
        }).catch(function () {});
    }
  });
})();
