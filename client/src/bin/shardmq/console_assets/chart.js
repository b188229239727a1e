// A small SVG line chart: time on x (the last `windowMs`), values on y from 0 to the largest
// value shown. Drawn anew on every sample.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 200;
const LEFT = 56;
const BOTTOM = 22;
const TOP = 8;
const RIGHT = 8;

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function label(value) {
  if (value >= 1e9) return (value / 1e9).toFixed(1) + "G";
  if (value >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (value >= 1e3) return (value / 1e3).toFixed(1) + "k";
  return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(2);
}

// Draws `series` ([{name, color, points: [[ms, value], …]}]) into the <svg> `target`.
export function drawChart(target, series, windowMs, nowMs) {
  target.setAttribute("viewBox", "0 0 " + WIDTH + " " + HEIGHT);
  target.replaceChildren();
  const start = nowMs - windowMs;
  const values = series.flatMap((line) => line.points.map(([, value]) => value));
  const top = Math.max(1, ...values) * 1.1;
  const x = (ms) => LEFT + ((ms - start) / windowMs) * (WIDTH - LEFT - RIGHT);
  const y = (value) => HEIGHT - BOTTOM - (value / top) * (HEIGHT - BOTTOM - TOP);
  for (let step = 0; step <= 4; step += 1) {
    const value = (top * step) / 4;
    target.append(svg("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y(value), y2: y(value),
      stroke: "#e4e7ec" }));
    target.append(svg("text", { x: LEFT - 6, y: y(value) + 4, "text-anchor": "end",
      "font-size": 11, fill: "#667085" }, label(value)));
  }
  const minutes = Math.round(windowMs / 60000);
  for (let minute = 0; minute <= minutes; minute += 1) {
    const ms = nowMs - minute * 60000;
    target.append(svg("text", { x: x(ms), y: HEIGHT - 6, "text-anchor": "middle",
      "font-size": 11, fill: "#667085" }, minute === 0 ? "now" : "-" + minute + "m"));
  }
  for (const line of series) {
    const shown = line.points.filter(([ms]) => ms >= start);
    if (shown.length === 0) continue;
    const path = shown.map(([ms, value]) => x(ms).toFixed(1) + "," + y(value).toFixed(1));
    target.append(svg("polyline", { points: path.join(" "), fill: "none", stroke: line.color,
      "stroke-width": 2, "data-series": line.name }));
  }
}
