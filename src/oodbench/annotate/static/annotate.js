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

  function submit(form) { if (form.requestSubmit) { form.requestSubmit(); } else { form.submit(); } }

  function zoomable(target) { return target && target.tagName === "IMG" && target.closest(".thumbs"); }

  document.addEventListener("keydown", function (event) {
    if (zoomable(event.target) && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault(); event.target.classList.toggle("zoomed"); return;
    }
    var form = $("verdict-form");
    if (!form || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (event.key === "Escape" && typing(event.target)) { event.target.blur(); return; }
    // A select does not submit its form on Enter by itself; the reason dropdown should.
    if (event.key === "Enter" && event.target.tagName === "SELECT" && form.contains(event.target)) {
      event.preventDefault(); choose("ambiguous"); submit(form); return;
    }
    if (typing(event.target)) { return; }
    var key = event.key.toLowerCase();
    if (key === "o") { event.preventDefault(); choose("ood", "label"); }
    else if (key === "i") { event.preventDefault(); choose("id", "class"); }
    else if (key === "a") { event.preventDefault(); choose("ambiguous", "reason"); }
    else if (key === "f") { event.preventDefault(); var fine = $("fine"); if (fine) { fine.checked = !fine.checked; } }
    else if (key === "enter" && event.target.tagName !== "BUTTON" && event.target.tagName !== "A") {
      event.preventDefault(); submit(form);
    }
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
        if (button.dataset.reason && $("reason")) { $("reason").value = button.dataset.reason; choose("ambiguous", "reason"); }
      });
    });
    // Example images grow on click (or Enter) and shrink on the next one.
    document.querySelectorAll(".thumbs img").forEach(function (img) {
      img.addEventListener("click", function () { img.classList.toggle("zoomed"); });
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
