/* The HTML report's print step (charts/report.py). Printing lays the page out at the paper's
   width, but plotly drew each chart at the window's width and does not redraw for print: a chart
   drawn for a 1440 px window would run off an A4 page. So each chart is redrawn at the printable
   width before printing (A4 less the @page margins of assets/report.css: 210 − 2 × 12 mm =
   186 mm = 703 CSS px) and follows the window again after. */
(function () {
  var PRINT_WIDTH = 703;
  function plots() { return Array.prototype.slice.call(document.querySelectorAll(".js-plotly-plot")); }
  window.addEventListener("beforeprint", function () {
    plots().forEach(function (gd) { Plotly.relayout(gd, {width: PRINT_WIDTH}); });
  });
  window.addEventListener("afterprint", function () {
    plots().forEach(function (gd) {
      Plotly.relayout(gd, {width: null}).then(function () { Plotly.Plots.resize(gd); });
    });
  });
})();
