// Reloads the page every data-refresh seconds, unless the box is unticked
// (remembered per browser) or a form is being filled in.
(function () {
  var secs = parseInt(document.body.getAttribute("data-refresh"), 10);
  var box = document.getElementById("autorefresh");
  if (!secs || !box) return;
  box.checked = localStorage.getItem("outbox-console-refresh") !== "off";
  box.addEventListener("change", function () {
    localStorage.setItem("outbox-console-refresh", box.checked ? "on" : "off");
  });
  function busy() {
    var a = document.activeElement;
    if (a && a !== box && (a.tagName === "INPUT" || a.tagName === "TEXTAREA" || a.tagName === "BUTTON")) return true;
    var inputs = document.querySelectorAll("input[name=reason], input[name=aggregate_type], input[name=aggregate_id], input[name=event_type], input[name=error], input[name=id]");
    for (var i = 0; i < inputs.length; i++) if (inputs[i].value) return true;
    return false;
  }
  setInterval(function () {
    if (box.checked && !busy()) location.reload();
  }, secs * 1000);
})();
