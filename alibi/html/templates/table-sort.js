(function () {
  "use strict";
  // Click-to-sort on the headers of tables marked "sortable". The page is complete without this:
  // rows are already sorted by differing elements when rendered.
  function key(row, i) {
    var cell = row.cells[i];
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent.trim(); }
    var n = parseFloat(v);
    return isNaN(n) ? v.toLowerCase() : n;
  }
  function sort(table, th) {
    var i = th.cellIndex, body = table.tBodies[0];
    var descending = th.getAttribute("aria-sort") !== "descending";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var x = key(r, i), y = key(s, i);
      if (typeof x !== typeof y) { x = String(x); y = String(y); }
      return (x < y ? -1 : x > y ? 1 : 0) * (descending ? -1 : 1);
    });
    Array.prototype.forEach.call(table.querySelectorAll("th[data-sort]"), function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    rows.forEach(function (r) { body.appendChild(r); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable th[data-sort]"), function (th) {
    th.tabIndex = 0;
    th.title = "sort by this column";
    th.addEventListener("click", function () { sort(th.closest("table"), th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(th.closest("table"), th); }
    });
  });
})();
