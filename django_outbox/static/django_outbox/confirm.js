/* celery-outbox: ask before a button that carries data-confirm submits its form.

   A static file rather than an onclick attribute: a page under a Content-Security-Policy
   of script-src 'self' runs it, where it refuses inline handlers. Without JavaScript the
   button posts without asking (the server checks the permission and the CSRF token either
   way). */
"use strict";
document.addEventListener("click", function (event) {
  const button = event.target instanceof Element && event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});
