// The quality page's charts, drawn with Chart.js (static/vendor) from the figures the page embeds
// as JSON (`json_script`, id "quality-charts"). The tables beside each chart hold the same figures:
// without this file, or without JavaScript, nothing is lost but the pictures.
(function () {
  "use strict";

  // A series' tone is one of the page's own colours (static/batchdesk.css).
  function colour(tone) {
    var name = { ok: "--ok", bad: "--bad", warn: "--warn" }[tone] || "--accent";
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#1f5fbf";
  }

  function dataset(chart, series) {
    var tone = colour(series.tone);
    return {
      label: series.label,
      data: series.values,
      backgroundColor: tone,
      borderColor: tone,
      borderWidth: chart.type === "line" ? 2 : 0,
      pointRadius: chart.type === "line" ? 3 : 0,
      maxBarThickness: 48,
      spanGaps: false,
    };
  }

  function options(chart) {
    var percent = chart.unit === "%";
    return {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      scales: {
        x: { stacked: !!chart.stacked },
        y: {
          stacked: !!chart.stacked,
          beginAtZero: true,
          max: percent ? 100 : undefined,
          ticks: {
            precision: 0,
            callback: function (value) {
              return percent ? value + "%" : value;
            },
          },
        },
      },
      plugins: {
        legend: { position: "bottom" },
        tooltip: {
          callbacks: {
            label: function (context) {
              var value = context.parsed.y;
              return context.dataset.label + ": " + (value === null ? "—" : value + (percent ? "%" : ""));
            },
          },
        },
      },
    };
  }

  function draw() {
    var source = document.getElementById("quality-charts");
    if (!source || !window.Chart) return;
    var charts = JSON.parse(source.textContent);
    document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var chart = charts[canvas.dataset.chart];
      if (!chart || !chart.labels.length) return;
      new window.Chart(canvas, {
        type: chart.type,
        data: {
          labels: chart.labels,
          datasets: chart.series.map(function (series) {
            return dataset(chart, series);
          }),
        },
        options: options(chart),
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
