"""Dataset tools: import/export CppPerf-DB records, filters, the HTML report."""
